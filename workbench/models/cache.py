"""The on-disk cache of prepared models, and how a directory gets into it safely.

The cache lives in `$WORKBENCH_CACHE` (default `~/.cache/workbench`); prepared models go to
`models/NAME/`. `prepared_dir` builds a directory at most once: under a file lock (so two
processes never build the same model at once) it builds into a temporary sibling and renames it
into place, so a crash leaves no half-written model behind. A marker file written last,
`MARKER`, records what the directory was built from; a directory whose marker does not match
the current source is rebuilt.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

MARKER = ".workbench-prepared.json"
_FORMAT = 1  # bump to rebuild every cached model after a change in how they are built


def cache_dir() -> Path:
    """The root of the cache: `$WORKBENCH_CACHE`, else `~/.cache/workbench`."""
    root = os.environ.get("WORKBENCH_CACHE") or Path.home() / ".cache" / "workbench"
    return Path(root).expanduser()


def model_cache_dir(name: str) -> Path:
    """Where the prepared model `name` lives (it may not exist yet)."""
    return cache_dir() / "models" / name


def read_marker(path: Path) -> dict | None:
    """The marker of a prepared directory, or None when it has none (or an unreadable one)."""
    try:
        return json.loads((Path(path) / MARKER).read_text())
    except (OSError, ValueError):
        return None


def is_prepared(path: Path, source: dict) -> bool:
    """Whether `path` holds a complete build from `source` (as recorded by its marker)."""
    marker = read_marker(path)
    return marker is not None and marker.get("format") == _FORMAT and marker.get("source") == source


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive inter-process lock held on `path` (created if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def prepared_dir(target: Path, source: dict, build: Callable[[Path], None]) -> Path:
    """`target`, built by `build(tmp_dir)` unless a build from `source` is already there.

    `source` is a JSON-able description of the input (file, size, versions); it is stored in
    the marker and compared on later calls. Returns `target`.
    """
    target = Path(target)
    if is_prepared(target, source):
        return target
    with file_lock(target.parent / f".{target.name}.lock"):
        if is_prepared(target, source):  # another process built it while we waited
            return target
        for stale in target.parent.glob(f".{target.name}.tmp-*"):  # left by a crashed build
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it private; a model directory is not
            build(tmp)
            marker = {"format": _FORMAT, "source": source}
            (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
            _replace_dir(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def _replace_dir(new: Path, target: Path) -> None:
    """Rename `new` to `target`, moving an outdated `target` out of the way first."""
    if target.exists():
        old = target.with_name(f".{target.name}.tmp-old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(target, old)
        os.rename(new, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(new, target)
