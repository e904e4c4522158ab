"""`DashboardJob`: feature dashboards of an SAE over a dataset, as a capture job of the SAE's
features (its `hook_sae_acts_post`, sparse, every prompt position but each document's first
`skip_positions`) whose shards hold each feature's share of the statistics instead of the rows,
merged once at the end into Parquet.

A document's first position is left out by default (`skip_positions=1`): without a BOS token it
is the attention sink, whose residual stream in SmolLM2 is about a hundred times as long as
the others', so its features would top every list; SAELens leaves BOS positions out of its
training and dashboards alike. A window still shows its token, at activation 0.

>>> job = DashboardJob("smollm2-135m-instruct", "corpus.jsonl", "sae/", "dash/")  # doctest: +SKIP
>>> job.run()                                                                     # doctest: +SKIP
>>> job.open().feature(17)             # its top contexts, samples, histogram, logits  # doctest: +SKIP

For every feature of the SAE:
- its `TOP` (20) most activating positions (largest first, ties by document row then
  position), each with a window of tokens around it (`WINDOW`: 12 before, 4 after) and the
  feature's activation at each;
- samples across its distribution: its non-zero activations cut into `INTERVALS` (10) equal
  shares by count (deciles), `SAMPLES` (5) positions from each, chosen by a hash of (row,
  position, feature): the same positions however the documents were split;
- a histogram of its non-zero activations over fixed quarter-octave bins (`bin_edges()`), how
  many positions it fires on and its density (that over the tokens);
- the 10 tokens its decoder row raises most and least through the unembedding (`W_dec[i] @ W_U`,
  the model's LM head in its own arithmetic: no final norm, no logit soft-capping).

Each shard keeps, per feature, its own top `TOP`, its `SAMPLES` smallest-hash positions per
histogram bin (an interval is a union of bins, so its smallest hashes are among those), its
histogram and firing count, with every kept position's window; shard 0 also holds the logit
table. `finish` merges them in one fixed order into `features.parquet` (one row per feature) and
`contexts.parquet` (one row per context) beside `dashboards.json`. The documents' activations
are the engine's batch-invariant ones (jobs' default), so the files are the same bytes however
the documents were split into shards, on one process or on Ray replicas; resume, faults and
error rows are the capture job's.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from workbench.inspect.dashboards import CONTEXTS_FILE, DASHBOARDS_FILE, FEATURES_FILE
from workbench.jobs import shards as sh
from workbench.jobs.capture import CaptureJob, CaptureReplica, ShardComputer
from workbench.jobs.dataset import Document, JobError

TOP = 20  # top-activating contexts a feature
INTERVALS = 10  # shares of a feature's non-zero activations samples are drawn from
SAMPLES = 5  # contexts an interval
WINDOW = (12, 4)  # tokens before and after a context's position
LOGITS = 10  # tokens raised (and lowered) most by a feature's decoder row
BINS_PER_OCTAVE = 4
LOW_BIN = -20 * BINS_PER_OCTAVE  # the first bin: below 2^-20 (everything smaller in it)
NUM_BINS = 2 * 20 * BINS_PER_OCTAVE + 1  # the last: 2^20 and above
SAE_NAME = "dashboard-sae"
_LOGIT_CHUNK = 256  # features a logit product


def bin_edges() -> list[float]:
    """The histogram's bin edges (NUM_BINS + 1): bin b holds activations in
    [edges[b], edges[b + 1]); the first starts at 0, the last is open."""
    return [0.0] + [2.0 ** ((LOW_BIN + b) / BINS_PER_OCTAVE) for b in range(1, NUM_BINS)] + \
        [math.inf]


def _bins(values: Any) -> Any:
    import numpy as np

    with np.errstate(divide="ignore"):
        b = np.floor(np.log2(values.astype(np.float64)) * BINS_PER_OCTAVE)
    return (np.clip(b, LOW_BIN, LOW_BIN + NUM_BINS - 1) - LOW_BIN).astype(np.int64)


def _hash(row: Any, pos: Any, feature: Any) -> Any:
    """A fixed pseudo-random 63-bit number of each (row, position, feature) (splitmix64)."""
    import numpy as np

    x = (row.astype(np.uint64) << np.uint64(40)) ^ (pos.astype(np.uint64) << np.uint64(20)) ^ \
        feature.astype(np.uint64)
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(1)).astype(np.int64)


def _first_of_groups(keys: list[Any], group: Any, keep: int) -> Any:
    """Indices of the first `keep` entries of each `group` value once sorted by `keys` (the
    last key sorts first, as numpy's lexsort)."""
    import numpy as np

    order = np.lexsort([*keys, group])
    g = group[order]
    starts = np.r_[0, np.flatnonzero(g[1:] != g[:-1]) + 1] if len(g) else np.zeros(0, np.int64)
    rank = np.arange(len(g)) - np.repeat(starts, np.diff(np.r_[starts, len(g)]))
    return order[rank < keep]


class DashboardComputer(ShardComputer):
    """A shard's share of every feature's dashboard (see the module docstring)."""

    def __init__(self, llm: Any, job: dict[str, Any], out: str,
                 where: dict[str, str] | None = None):
        super().__init__(llm, job, out, where)
        [self.site] = self.names  # the SAE's features
        self.sae = llm.saes[SAE_NAME]

    def compute(self, k: int, start: int, docs: list[Document]) -> dict[str, Any]:
        import numpy as np
        import torch

        began = time.perf_counter()
        prompts, outs, errors = self.run(docs)
        token_ids: list[int] = []
        doc_offsets = [0]
        rows, positions, features, values = [], [], [], []
        for i in range(len(docs)):
            out = outs.get(i)
            if isinstance(out, str):
                errors[str(i)] = out
            if str(i) not in errors:
                assert out is not None
                acts = out.activations[self.site].coalesce()  # [prompt, d_sae], sparse
                where = acts.indices().numpy()
                rows.append(np.full(where.shape[1], start + i, dtype=np.int64))
                positions.append(np.asarray(out.activations.positions)[where[0]])
                features.append(where[1])
                values.append(acts.values().numpy())
                token_ids.extend(prompts[i][0])
            doc_offsets.append(len(token_ids))
        row, pos, feature, value = (np.concatenate(a) if a else np.zeros(0, dtype)
                                    for a, dtype in zip((rows, positions, features, values), (
                                        np.int64, np.int64, np.int64, np.float32)))
        d_sae = self.sae.d_sae
        b = _bins(value)
        tensors: dict[str, Any] = {
            "tokens": torch.tensor([len(token_ids)]),
            "fires": torch.from_numpy(np.bincount(feature, minlength=d_sae)),
            "hist": torch.from_numpy(np.bincount(feature * NUM_BINS + b, minlength=d_sae *
                                                 NUM_BINS).reshape(d_sae, NUM_BINS))}
        h = _hash(row, pos, feature)
        top = _first_of_groups([pos, row, -value], feature, TOP)
        sample = _first_of_groups([h], feature * NUM_BINS + b, SAMPLES)
        chosen = np.concatenate([top, sample])
        kind = np.r_[np.zeros(len(top), np.int8), np.ones(len(sample), np.int8)]
        window_tokens, window_acts = self._windows(
            row[chosen], pos[chosen], feature[chosen], (row, pos, feature, value),
            start, doc_offsets, token_ids)
        tensors.update({"kind": torch.from_numpy(kind), "feature": torch.from_numpy(
            feature[chosen]), "row": torch.from_numpy(row[chosen]), "position": torch.from_numpy(
            pos[chosen]), "bin": torch.from_numpy(b[chosen]), "hash": torch.from_numpy(
            h[chosen]), "activation": torch.from_numpy(value[chosen]),
            "window_tokens": torch.from_numpy(window_tokens),
            "window_activations": torch.from_numpy(window_acts)})
        if k == 0:
            tensors.update(self._logit_table())
        manifest = {"shard": k, "rows": [start, start + len(docs)],
                    "doc_ids": [d.doc_id for d in docs], "documents": len(docs),
                    "tokens": len(token_ids), "doc_offsets": doc_offsets, "errors": errors,
                    "seconds": round(time.perf_counter() - began, 3), **self.where}
        return sh.write_shard(self.out, k, {n: t.contiguous() for n, t in tensors.items()},
                              manifest)

    @staticmethod
    def _windows(row: Any, pos: Any, feature: Any, entries: tuple[Any, Any, Any, Any],
                 start: int, doc_offsets: list[int], token_ids: list[int]) -> tuple[Any, Any]:
        """Each chosen position's window: its document's token ids (-1 outside it) and the
        feature's activation at each (0 where it does not fire)."""
        import numpy as np

        before, after = WINDOW
        offsets = np.arange(-before, after + 1)
        wpos = pos[:, None] + offsets[None, :]  # [C, W]
        first = np.asarray(doc_offsets)[row - start]
        length = np.asarray(doc_offsets)[row - start + 1] - first
        inside = (wpos >= 0) & (wpos < length[:, None])
        tokens = np.where(inside, np.asarray(token_ids + [-1], dtype=np.int64)[
            np.where(inside, first[:, None] + wpos, len(token_ids))], -1)
        e_row, e_pos, e_feature, e_value = entries
        key = (e_row << 40) | (e_pos << 20) | e_feature
        order = np.argsort(key, kind="stable")
        keys, vals = key[order], e_value[order]
        want = (row[:, None] << 40) | (np.where(inside, wpos, 0) << 20) | feature[:, None]
        at = np.clip(np.searchsorted(keys, want), 0, max(len(keys) - 1, 0))
        found = inside & (keys[at] == want) if len(keys) else np.zeros_like(inside)
        acts = np.where(found, vals[at] if len(keys) else 0.0, 0.0).astype(np.float32)
        return tokens, acts

    def _logit_table(self) -> dict[str, Any]:
        """The `LOGITS` tokens each feature's decoder row raises and lowers most through the
        model's LM head (on the model thread: the engine's own weights and arithmetic)."""
        import torch

        from workbench.engine.kernels import c_layer_ops
        from workbench.engine.model_thread import on_model_thread

        engine = self.llm.llm_engine
        w_dec = self.sae.weights["W_dec"]

        def top(logits: Any) -> tuple[Any, Any]:
            """The `LOGITS` largest of each row (ids, values), an equal value after those of
            lower id: one C pass (`ranks_and_top_k`), torch's `topk` where it cannot run."""
            found = c_layer_ops.ranks_and_top_k(
                logits, torch.zeros(logits.shape[0], dtype=torch.int64), LOGITS)
            if found is None:
                return logits.topk(LOGITS, dim=-1)
            return found[1], found[2]

        def table() -> dict[str, Any]:
            head, dtype = engine.runner.model.lm_head, engine.loaded.dtype
            parts: dict[str, list[Any]] = {"up_ids": [], "up": [], "down_ids": [], "down": []}
            with torch.inference_mode():
                for at in range(0, w_dec.shape[0], _LOGIT_CHUNK):
                    logits = head(w_dec[at:at + _LOGIT_CHUNK].to(dtype)).float()
                    (up_ids, up), (down_ids, down) = top(logits), top(logits.neg_())
                    parts["up_ids"].append(up_ids)
                    parts["up"].append(up)
                    parts["down_ids"].append(down_ids)
                    parts["down"].append(-down)
            return {f"logits_{n}": torch.cat(t) for n, t in parts.items()}

        return on_model_thread(table)


class DashboardReplica(CaptureReplica):
    computer_class = DashboardComputer


class DashboardJob(CaptureJob):
    """Feature dashboards of the SAE in the folder `sae` over `data` (see the module
    docstring), written into `out` (rerun: resume). The capture job's arguments otherwise:
    `ray=True, replicas=N` on Ray; `docs_per_shard`; `text_column`, `chat_column`; `llm=`
    this process's engine (the SAE is loaded on it for the job, then unloaded)."""

    computer_class = DashboardComputer
    replica_class = DashboardReplica

    def __init__(self, model: Any, data: Any, sae: str, out: str, *, skip_positions: int = 1,
                 **kwargs: Any):
        from workbench.features.sae import SparseAutoencoder

        if not isinstance(model, str):
            raise JobError("a dashboards job names its model (by name or path; `llm=` for this "
                           "process's engine)")
        for taken in ("scores", "saes"):
            if taken in kwargs:
                raise JobError(f"a dashboards job takes no {taken!r}: it reads the SAE's "
                               "features alone")
        if isinstance(skip_positions, bool) or not isinstance(skip_positions, int) or \
                skip_positions < 0:
            raise JobError(f"skip_positions must be an integer >= 0, got {skip_positions!r}")
        self.skip_positions = skip_positions
        loaded = SparseAutoencoder.load(SAE_NAME, sae, "sae")
        site = f"{loaded.hook_name_out or loaded.hook_name}.hook_sae_acts_post"
        engine = kwargs.get("llm")
        spec = {"sites": [site], "sparse": True, "sae": SAE_NAME,
                "positions": {"start": skip_positions}}
        super().__init__(model, data, spec, out,
                         saes=None if engine is not None else {SAE_NAME: sae}, **kwargs)
        self.saes = {SAE_NAME: os.path.abspath(sae)}  # in job.json however it is loaded

    def job_extra(self) -> dict[str, Any]:
        return {"dashboards": {"skip_positions": self.skip_positions, "top": TOP,
                               "intervals": INTERVALS, "samples": SAMPLES,
                               "window": list(WINDOW), "logits": LOGITS,
                               "bins_per_octave": BINS_PER_OCTAVE, "low_bin": LOW_BIN,
                               "num_bins": NUM_BINS}}

    def run(self) -> dict[str, Any]:
        given = self.llm is not None and SAE_NAME not in self.llm.saes
        if given:
            self.llm.load_sae(SAE_NAME, self.saes[SAE_NAME])
        try:
            summary = super().run()
        finally:
            if given:
                self.llm.unload_sae(SAE_NAME)
        began = time.perf_counter()
        self.finish()
        summary["merge_seconds"] = round(time.perf_counter() - began, 2)
        return summary

    def finish(self) -> None:
        """Merges the shards into features.parquet and contexts.parquet (see the module
        docstring)."""
        merge(self.out, self._tokenizer())

    def _tokenizer(self) -> Any:
        if self.llm is not None:
            return self.llm.get_tokenizer()
        from transformers import AutoTokenizer

        from workbench.models import resolve_model

        return AutoTokenizer.from_pretrained(resolve_model(self.model, prepare=False).path,
                                             local_files_only=True)

    def open(self) -> Any:
        """The finished job's dashboards (`workbench.inspect.dashboards.FeatureDashboards`)."""
        from workbench.inspect.dashboards import FeatureDashboards

        return FeatureDashboards(self.out)


def merge(out: str, tokenizer: Any) -> None:
    """The shards of a finished dashboards job in `out` -> its Parquet files."""
    import numpy as np
    import pandas as pd
    from safetensors.numpy import load_file

    job = json.loads((Path(out) / sh.JOB_FILE).read_text())
    index = pd.read_parquet(Path(out) / sh.INDEX_FILE)
    shards = [load_file(sh.shard_paths(out, int(k))[0]) for k in sorted(index["shard"].unique())]
    tokens = int(sum(int(s["tokens"][0]) for s in shards))
    fires = np.sum([s["fires"] for s in shards], axis=0)
    hist = np.sum([s["hist"] for s in shards], axis=0)
    cand = {n: np.concatenate([s[n] for s in shards]) for n in (
        "kind", "feature", "row", "position", "bin", "hash", "activation", "window_tokens",
        "window_activations")}
    is_top = cand["kind"] == 0
    top = np.flatnonzero(is_top)[_first_of_groups(
        [cand["position"][is_top], cand["row"][is_top], -cand["activation"][is_top]],
        cand["feature"][is_top], TOP)]
    # a sample's interval: where its bin's middle falls in the feature's count of activations
    cumulative = np.cumsum(hist, axis=1) - hist / 2
    share = cumulative / np.maximum(fires, 1)[:, None]
    interval = np.minimum((share * INTERVALS).astype(np.int64), INTERVALS - 1)
    sampled = np.flatnonzero(~is_top)
    sample_interval = interval[cand["feature"][sampled], cand["bin"][sampled]]
    sampled = sampled[_first_of_groups([cand["hash"][sampled]], cand["feature"][sampled] *
                                       INTERVALS + sample_interval, SAMPLES)]
    doc_ids = dict(zip(index["row"].tolist(), index["doc_id"].tolist()))
    text = _texts(tokenizer)
    chosen = {kind: c[np.lexsort([cand["hash"][c], cand["position"][c], cand["row"][c],
                                  -cand["activation"][c], cand["feature"][c]])]
              for kind, c in (("top", top), ("sample", sampled))}
    order = np.concatenate(list(chosen.values()))
    is_sample = np.arange(len(order)) >= len(chosen["top"])
    feature, row, position = (cand[n][order] for n in ("feature", "row", "position"))
    window = cand["window_tokens"][order]  # [C, W], -1 outside the document
    kept = window >= 0
    counts = kept.sum(axis=1)
    token_ids = window[kept]
    intervals = pd.array(interval[feature, cand["bin"][order]], dtype="Int64")
    intervals[~is_sample] = pd.NA
    contexts = pd.DataFrame({
        "feature": feature, "kind": np.where(is_sample, "sample", "top"),
        "interval": intervals, "doc_id": [str(doc_ids[r]) for r in row.tolist()], "row": row,
        "position": position, "activation": cand["activation"][order].astype(np.float64),
        "window_start": position - WINDOW[0] + kept.argmax(axis=1),
        "token_ids": _ragged(token_ids, counts),
        "tokens": _ragged(_token_texts(token_ids, text), counts),
        "activations": _ragged(cand["window_activations"][order][kept], counts)}).astype(
        {"kind": "string", "doc_id": "string"})
    first = shards[0]
    d_sae = hist.shape[0]
    max_activation = np.zeros(d_sae, np.float32)
    np.maximum.at(max_activation, cand["feature"][top], cand["activation"][top])
    features = pd.DataFrame({
        "feature": np.arange(d_sae), "fires": fires, "density": fires / max(tokens, 1),
        "max_activation": max_activation, "histogram": list(hist),
        "top_logit_ids": list(first["logits_up_ids"]),
        "top_logit_tokens": _token_texts(first["logits_up_ids"], text).tolist(),
        "top_logits": list(first["logits_up"]),
        "bottom_logit_ids": list(first["logits_down_ids"]),
        "bottom_logit_tokens": _token_texts(first["logits_down_ids"], text).tolist(),
        "bottom_logits": list(first["logits_down"])})
    _write_parquet(features, Path(out) / FEATURES_FILE)
    _write_parquet(contexts, Path(out) / CONTEXTS_FILE)
    sh.write_atomic(Path(out) / DASHBOARDS_FILE, json.dumps({
        "sae": job["saes"][SAE_NAME], "site": job["capture"]["names"][0], "d_sae": d_sae,
        "tokens": tokens, "documents": int(len(index)),
        "errors": int(index["error"].notna().sum()), "bin_edges": bin_edges()[:-1],
        **job["dashboards"]}, indent=1).encode())


def _ragged(flat: Any, counts: Any) -> list[list[Any]]:
    """`flat` cut into lists of `counts[i]` items each, in order."""
    import numpy as np

    return [part.tolist() for part in np.split(flat, np.cumsum(counts)[:-1])] \
        if len(counts) else []


def _token_texts(ids: Any, text: Any) -> Any:
    """The text of each token id in `ids` (an array of any shape): an object array of its shape,
    each distinct id decoded once."""
    import numpy as np

    unique, at = np.unique(ids, return_inverse=True)
    return np.array([text(int(t)) for t in unique], dtype=object)[at].reshape(ids.shape)


def _texts(tokenizer: Any) -> Any:
    cache: dict[int, str] = {}

    def text(token: int) -> str:
        if token not in cache:
            cache[token] = tokenizer.decode([token])
        return cache[token]

    return text


def _write_parquet(frame: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)
