"""`CaptureReader`: a capture job's folder read back, memory-mapped (safetensors' `safe_open`).

>>> r = CaptureReader("out/")                                   # doctest: +SKIP
>>> r.index                  # pandas: doc_id, row, shard, start, stop, tokens, error
>>> r.doc("17")              # one document as the `ActivationCache` its request returns
>>> r.site("blocks.6.hook_resid_post")   # every document's rows, [rows, d]
>>> r.scores("17")           # its per-token scores, a pandas frame
>>> loader = r.dataloader("blocks.6.hook_resid_post", batch_size=512, shuffle=True)

Nothing here needs Ray, and nothing but safetensors, JSON and Parquet is read: the same files
open without workbench (`safetensors.safe_open`, `json`, `pandas.read_parquet`).
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from workbench.jobs import shards as sh


class CaptureReader:
    """A finished capture job's folder (see the module docstring). `tokenizer`: to show tokens
    as text in `doc()` (default: the job's model's, when it can be loaded offline; else ids)."""

    def __init__(self, out: str | Path, tokenizer: Any = None):
        self.out = Path(out)
        if not (self.out / sh.INDEX_FILE).is_file():
            raise FileNotFoundError(f"{str(self.out)!r} has no {sh.INDEX_FILE}: the job has not "
                                    "finished (run it again to resume)")
        self.job = json.loads((self.out / sh.JOB_FILE).read_text())
        self.names: list[str] = list(self.job["capture"]["names"])
        self._tokenizer = tokenizer
        self._open: dict[int, Any] = {}

    def __repr__(self) -> str:
        return (f"CaptureReader({str(self.out)!r}: {len(self.index)} documents, "
                f"{int(self.index['tokens'].sum())} tokens, sites {self.names})")

    @cached_property
    def index(self) -> Any:
        """index.parquet as a pandas frame."""
        import pandas as pd

        return pd.read_parquet(self.out / sh.INDEX_FILE)

    def shard(self, k: int) -> Any:
        """Shard k, opened once (memory-mapped)."""
        from safetensors import safe_open

        if k not in self._open:
            path, _ = sh.shard_paths(self.out, k)
            self._open[k] = safe_open(str(path), framework="pt")
        return self._open[k]

    def _entry(self, doc: Any) -> Any:
        index = self.index
        hit = index[index["doc_id"] == str(doc)]
        if hit.empty and isinstance(doc, int) and 0 <= doc < len(index):
            hit = index[index["row"] == doc]
        if hit.empty:
            raise KeyError(f"no document {doc!r} in {str(self.out)!r}")
        entry = hit.iloc[0]
        if entry["error"] is not None and not _isna(entry["error"]):
            raise KeyError(f"document {doc!r} has no activations: {entry['error']}")
        return entry

    def _doc_rows(self, entry: Any) -> tuple[Any, int, int]:
        f = self.shard(int(entry["shard"]))
        i = int(entry["row"]) - int(self.job["docs_per_shard"]) * int(entry["shard"])
        rows = f.get_slice("row_offsets")[i:i + 2].tolist()
        return f, int(rows[0]), int(rows[1])

    def token_ids(self, doc: Any) -> list[int]:
        entry = self._entry(doc)
        f = self.shard(int(entry["shard"]))
        return f.get_slice("token_ids")[int(entry["start"]):int(entry["stop"])].tolist()

    def doc(self, doc: Any) -> Any:
        """Document `doc` (its id, or its row number) as an `ActivationCache`, the same names,
        rows and values (float32) as its request's `activations`."""
        from workbench.inspect.activations import ActivationCache

        entry = self._entry(doc)
        f, a, b = self._doc_rows(entry)
        ids = self.token_ids(doc)
        positions = f.get_slice("positions")[a:b].tolist()
        reduce = self.job["capture"].get("reduce")
        tensors = {}
        for n in self.names:
            t = f.get_slice(n)[a:b].float()
            tensors[n] = t[0] if reduce else t
        return ActivationCache(tokens=self._texts(ids), num_layers=self.num_layers,
                               tensors=tensors, positions=[] if reduce else positions,
                               reduce=reduce)

    def scores(self, doc: Any) -> Any:
        """Document `doc`'s per-token scores (with `scores=True`): token id, logprob of the
        token given those before it, entropy, rank, margin (and the assistant mask of a chat)."""
        import pandas as pd

        entry = self._entry(doc)
        f = self.shard(int(entry["shard"]))
        a, b = int(entry["start"]), int(entry["stop"])
        cols = {"token_id": f.get_slice("token_ids")[a:b].tolist()}
        for c in ("logprob", "entropy", "rank", "margin", "assistant_mask"):
            if c in f.keys():
                cols[c] = f.get_slice(c)[a:b].tolist()
        if len(cols) == 1:
            raise KeyError("this job did not record scores (scores=True)")
        return pd.DataFrame(cols)

    def site(self, name: str) -> Any:
        """Every document's rows of `name` (a full name), in document order: [rows, d]."""
        import torch

        if name not in self.names:
            raise KeyError(f"{name!r} was not captured; this job holds {self.names}")
        return torch.cat([self.shard(k).get_tensor(name) for k in self.shards])

    @property
    def shards(self) -> list[int]:
        return sorted({int(k) for k in self.index["shard"]})

    @property
    def num_layers(self) -> int:
        return max([int(n.split(".")[1]) for n in self.names if n.startswith("blocks.")] or
                   [0]) + 1

    def rows(self, name: str) -> Any:
        """A torch `Dataset` of `name`'s rows across the dataset (each item one row, read from
        its memory-mapped shard)."""
        return ActivationRows(self, name)

    def dataloader(self, name: str, batch_size: int = 256, shuffle: bool = False,
                   **kwargs: Any) -> Any:
        from torch.utils.data import DataLoader

        return DataLoader(self.rows(name), batch_size=batch_size, shuffle=shuffle, **kwargs)

    def _texts(self, ids: list[int]) -> list[str]:
        tok = self._tokenizer
        if tok is None:
            try:
                from transformers import AutoTokenizer

                from workbench.models import resolve_model

                path = resolve_model(self.job["model"], prepare=False).path
                tok = self._tokenizer = AutoTokenizer.from_pretrained(path,
                                                                      local_files_only=True)
            except Exception:  # a model not here: ids as text
                return [str(i) for i in ids]
        return [tok.decode([i]) for i in ids]


def _isna(value: Any) -> bool:
    try:
        import pandas as pd

        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


class ActivationRows:
    """Rows of one site across a job's shards, as a map-style torch Dataset."""

    def __init__(self, reader: CaptureReader, name: str):
        if name not in reader.names:
            raise KeyError(f"{name!r} was not captured; this job holds {reader.names}")
        self.reader, self.name = reader, name
        self.starts: list[int] = []
        self.shards = reader.shards
        total = 0
        for k in self.shards:
            self.starts.append(total)
            total += reader.shard(k).get_slice(name).get_shape()[0]
        self.total = total

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, i: int) -> Any:
        import bisect

        if not 0 <= i < self.total:
            raise IndexError(i)
        s = bisect.bisect_right(self.starts, i) - 1
        j = i - self.starts[s]
        return self.reader.shard(self.shards[s]).get_slice(self.name)[j:j + 1][0].float()


def open_capture(out: str | Path, tokenizer: Any = None) -> CaptureReader:
    return CaptureReader(out, tokenizer)
