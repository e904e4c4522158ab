"""What a process holds in memory, and giving back the pages of a checkpoint it has converted.

transformers loads a safetensors checkpoint whose dtype is the model's as private memory maps
of its files: each weight is a view of the file's pages, read from disk (or the page cache) as
they are first touched, and counted in the process's resident memory (`RssFile`) from then on,
for as long as the file's map lives, which is as long as any weight of that file does. A kernel
that keeps a weight in a layout of its own (a fused Q/K/V, oneDNN's or AMX's tiles) has copied
it: `release(weight)` then drops the file's pages under it from this process (`madvise(
MADV_DONTNEED)`), so resident memory holds the converted copy alone. Only a weight that lies in
one map of a file, every page of it still the file's (never written: `/proc/self/pagemap`), is
dropped: its content is the file's, so a later read (the tied embedding reading its rows, say)
maps the pages in again, unchanged. Memory of any other kind is left to its owner (anonymous
memory is freed when its last tensor goes; dropping its pages would zero them).

`resident()`: this process's resident and peak resident memory, in MB (Linux's `/proc`).
`available_beside(model)`: the memory the machine has available beside a loaded model's weights
(what the KV cache is sized from).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import functools
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

_PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4


@dataclass(frozen=True)
class Resident:
    """Resident memory in MB: now (`rss`, of it `anon` and `file`), and the peak (`peak`)."""

    rss: float
    anon: float
    file: float
    peak: float


def resident() -> Resident | None:
    """This process's resident memory (None where `/proc/self/status` is not there)."""
    fields = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                    fields[key] = round(int(value.split()[0]) / 1024, 1)  # kB
    except OSError:
        return None
    return Resident(fields.get("VmRSS", 0.0), fields.get("RssAnon", 0.0),
                    fields.get("RssFile", 0.0), fields.get("VmHWM", 0.0))


@dataclass(frozen=True)
class _FileMap:
    start: int
    end: int
    offset: int  # of the file, at `start`
    path: str


def _file_map_list() -> list[_FileMap]:
    """Every map of a file in this process, sorted by address."""
    maps = []
    try:
        with open("/proc/self/maps") as lines:
            for line in lines:
                parts = line.split(maxsplit=5)
                if len(parts) < 6 or not parts[5].startswith("/"):
                    continue  # not a file (anonymous, heap, stack, [vdso])
                start, end = (int(a, 16) for a in parts[0].split("-"))
                maps.append(_FileMap(start, end, int(parts[2], 16), parts[5].rstrip("\n")))
    except OSError:
        return []
    return sorted(maps, key=lambda m: m.start)


def _map_index(maps: list[_FileMap], address: int) -> int | None:
    """The index of the map in `maps` (sorted) that holds `address`, or None."""
    i = bisect.bisect_right([m.start for m in maps], address) - 1
    return i if i >= 0 and address < maps[i].end else None


def _all_file_pages(first: int, last: int) -> bool:
    """Whether every page in [first, last) is the file's: not present, or present as a file
    page (`/proc/self/pagemap` bit 61; a written page of a private map is anonymous)."""
    count = (last - first) // _PAGE
    try:
        with open("/proc/self/pagemap", "rb") as pagemap:
            pagemap.seek(first // _PAGE * 8)
            entries = memoryview(pagemap.read(count * 8)).cast("Q")
    except OSError:
        return False
    if len(entries) != count:
        return False
    present, file_page = 1 << 63, 1 << 61
    return all(not e & present or e & file_page for e in entries)


@functools.cache
def _madvise():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc.madvise


def release(*weights: torch.Tensor | None, keep: tuple = ()) -> int:
    """Drops from this process the whole pages of file maps under `weights` (weights a kernel
    has copied: see the module docstring), except those of a tensor in `keep` (a kernel's kept
    tensors, which may be the same memory); returns the bytes dropped. A no-op off Linux."""
    # (oneDNN's packed weight is opaque, always a copy of its own)
    kept = {t.untyped_storage().data_ptr() for t in keep
            if isinstance(t, torch.Tensor) and t.layout == torch.strided}
    spans = []
    for weight in weights:
        if weight is None or weight.device.type != "cpu" or weight.numel() == 0:
            continue
        storage = weight.untyped_storage()
        if storage.data_ptr() in kept:
            continue
        start = weight.data_ptr()
        spans.append((start, start + weight.numel() * weight.element_size()))
    if not spans or not os.path.exists("/proc/self/maps"):
        return 0
    maps = _file_map_list()
    dropped = 0
    for start, end in spans:
        i = _map_index(maps, start)
        if i is None or end > maps[i].end:
            continue  # not (wholly) in one file map
        first = -(-start // _PAGE) * _PAGE  # whole pages only: a neighbour's stay as they are
        last = end // _PAGE * _PAGE
        if last > first and _all_file_pages(first, last) and \
                _madvise()(first, last - first, _MADV_DONTNEED) == 0:
            dropped += last - first
            if _drop_cache:
                _uncache(maps[i].path, maps[i].offset + first - maps[i].start, last - first)
    return dropped


_drop_cache = False


@contextlib.contextmanager
def dropping_page_cache(drop: bool = True) -> Iterator[None]:
    """Within the block, `release` also drops the released bytes from the OS's page cache
    (`posix_fadvise(DONTNEED)`): for a checkpoint that its converted copies and its files do
    not both fit beside in memory (the 8B on 24 GB), so that the OS evicts the bytes already
    converted rather than those still to read (least recently used: the later ones, read
    before)."""
    global _drop_cache
    before, _drop_cache = _drop_cache, drop
    try:
        yield
    finally:
        _drop_cache = before


def page_cache_is_tight(nbytes: int) -> bool:
    """Whether a checkpoint of `nbytes` and its converted copy together may not fit in the
    page cache beside each other: more than a quarter of the machine's memory."""
    import psutil

    return nbytes > psutil.virtual_memory().total // 4


def _uncache(path: str, offset: int, length: int) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def trim() -> None:
    """Returns the C heap's free memory to the OS (glibc's `malloc_trim`): a conversion's
    temporaries (a fused group's concatenation before its kernel packs it) are freed into a
    heap that otherwise keeps them resident. A no-op where the C library has none."""
    trim_heap = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim_heap is not None:
        trim_heap(0)


def available_beside(model: torch.nn.Module) -> int | None:
    """The bytes of memory this machine has available once `model`'s weights are resident:
    the OS's available memory (`psutil`) less the weights that lie in a file's map (counted
    there as reclaimable page cache, but read every step). None for a model off the CPU."""
    import psutil

    params = list(model.parameters())
    if not params or params[0].device.type != "cpu":
        return None
    maps = _file_map_list()
    mapped = sum(p.numel() * p.element_size() for p in {p.data_ptr(): p for p in params}.values()
                 if _map_index(maps, p.data_ptr()) is not None)
    return max(0, psutil.virtual_memory().available - mapped)
