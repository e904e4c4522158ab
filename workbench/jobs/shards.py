"""A capture job's folder, readable without Ray or workbench (safetensors + JSON + Parquet):

    DIR/job.json                  model, dtype, kernel, spec, source fingerprint, version, ...
    DIR/shards/NNNNN.safetensors  one shard's documents, token-major, no padding
    DIR/shards/NNNNN.json         its manifest: documents, tokens, sha256, seconds, errors, where
                                  (host; on Ray the node id)
    DIR/index.parquet             one row per document: doc_id, row, shard, start, stop,
                                  tokens, error

A shard's tensors: `token_ids` [T] (int64, every document's tokens one after the other),
`doc_offsets` [D+1] (document i's tokens are `token_ids[doc_offsets[i]:doc_offsets[i+1]]`),
`row_offsets` [D+1] and `positions` [R] (the captured rows: document i's are
`row_offsets[i]:row_offsets[i+1]`, each at `positions` within its document; -1 for a reduced
row), one `[R, d]` tensor per full site name (the model's dtype for bf16 / fp16, else float32),
and with scores `logprob`, `entropy`, `margin` (float32 [T], NaN at a document's first token)
and `rank` (int64 [T], -1 there); a chat document adds `assistant_mask` (bool [T]). A document
that failed is there with no tokens and its error in the manifest and the index.

Every file is written under a temporary name and renamed when complete, so a file that exists
is whole; a shard counts as done when its manifest exists and the shard's sha256 is the one the
manifest records (a truncated or changed shard is computed again).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

JOB_FILE = "job.json"
INDEX_FILE = "index.parquet"
SHARDS = "shards"
# what a resumed job must share with the folder's (the version is recorded, not compared)
COMPARED = ("model", "dtype", "kernel", "capture", "scores", "saes", "source", "columns",
            "docs_per_shard", "batch_invariant", "max_model_len", "dashboards")


def shard_stem(k: int) -> str:
    return f"{k:05d}"


def shard_paths(out: str | Path, k: int) -> tuple[Path, Path]:
    folder = Path(out) / SHARDS
    return folder / f"{shard_stem(k)}.safetensors", folder / f"{shard_stem(k)}.json"


def write_atomic(path: str | Path, data: bytes) -> None:
    """`data` to a temporary name beside `path`, flushed, then renamed onto it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_shard(out: str | Path, k: int, tensors: dict[str, Any], manifest: dict[str, Any]
                ) -> dict[str, Any]:
    """The shard, then its manifest (with the shard's sha256 and size); returns the manifest."""
    from safetensors.torch import save  # deferred: torch

    data = save(tensors)
    shard, meta = shard_paths(out, k)
    write_atomic(shard, data)
    manifest = {**manifest, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    write_atomic(meta, json.dumps(manifest, indent=1).encode())
    return manifest


def read_manifest(out: str | Path, k: int) -> dict[str, Any] | None:
    _, meta = shard_paths(out, k)
    try:
        return json.loads(meta.read_text())
    except (OSError, ValueError):
        return None


def shard_done(out: str | Path, k: int, start: int, stop: int) -> dict[str, Any] | None:
    """The manifest of shard k when the shard is complete and whole (its rows as planned, its
    sha256 as recorded), else None."""
    manifest = read_manifest(out, k)
    shard, _ = shard_paths(out, k)
    if manifest is None or manifest.get("rows") != [start, stop] or not shard.is_file():
        return None
    if shard.stat().st_size != manifest.get("bytes") or sha256_file(shard) != manifest["sha256"]:
        return None
    return manifest


def prepare_folder(out: str | Path, job: dict[str, Any]) -> None:
    """Creates the folder and writes job.json, or checks the one there: a job that differs
    (model, spec, source, ...) is refused naming each difference."""
    from workbench.jobs.dataset import JobError  # the job's error type

    out = Path(out)
    try:
        (out / SHARDS).mkdir(parents=True, exist_ok=True)
        probe = out / SHARDS / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise JobError(f"cannot write to the output folder {str(out)!r}: {exc}") from exc
    differ = job_differences(out, job)
    if differ:
        raise JobError(f"{str(out)!r} holds another job's output; it differs in "
                       + "; ".join(differ) + ". Use another --out folder.")
    if differ is None:
        write_atomic(out / JOB_FILE, json.dumps(job, indent=1, sort_keys=True).encode())


def job_differences(out: str | Path, job: dict[str, Any]) -> list[str] | None:
    """How the job.json in `out` differs from `job` in what makes a job (`COMPARED`), one line
    a key; None where `out` holds no readable job.json."""
    try:
        old = json.loads((Path(out) / JOB_FILE).read_text())
    except (OSError, ValueError):
        return None
    return [f"{key}: folder has {old.get(key)!r}, this job {job.get(key)!r}"
            for key in COMPARED if old.get(key) != job.get(key)]


def clean_temporaries(out: str | Path) -> int:
    """Removes temporary files a killed writer left; returns how many."""
    count = 0
    for folder in (Path(out), Path(out) / SHARDS):
        for p in folder.glob(".*.tmp-*"):
            p.unlink(missing_ok=True)
            count += 1
    return count


def write_index(out: str | Path, manifests: list[dict[str, Any]]) -> Any:
    """index.parquet from the shards' manifests (in shard order); returns the frame."""
    import pandas as pd  # deferred: only the index needs it

    records = []
    for m in sorted(manifests, key=lambda m: m["shard"]):
        offsets = m["doc_offsets"]
        for i, doc_id in enumerate(m["doc_ids"]):
            records.append({"doc_id": doc_id, "row": m["rows"][0] + i, "shard": m["shard"],
                            "start": offsets[i], "stop": offsets[i + 1],
                            "tokens": offsets[i + 1] - offsets[i],
                            "error": m["errors"].get(str(i))})
    frame = pd.DataFrame.from_records(
        records, columns=["doc_id", "row", "shard", "start", "stop", "tokens", "error"])
    frame = frame.astype({"doc_id": "string", "row": "int64", "shard": "int64",
                          "start": "int64", "stop": "int64", "tokens": "int64",
                          "error": "string"})
    path = Path(out) / INDEX_FILE
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return frame
