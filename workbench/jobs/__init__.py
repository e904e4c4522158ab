"""Research at scale: a whole file or dataset through the engine, on one machine or on a Ray
cluster, resumable and exact.

`batch_file` (`workbench run-batch`: the OpenAI Batch file format through the server's own
routes), `dataset` (documents from JSONL, Parquet, a list or a `datasets.Dataset`), `capture`
(`CaptureJob`: activations and per-token scores of every document into shards), `shards`
(safetensors shards, their manifests, the job file and the index), `ray_pool` (Ray Data's actor
pool of engine replicas; Ray is optional), `reader` (`CaptureReader`: the shards read back),
`sae_training` (`train_sae`: an SAE trained with SAELens on a capture's rows, and measured) and
`dashboards` (`DashboardJob`: every feature's dashboard over a dataset, as Parquet).
Names load lazily.
"""

from __future__ import annotations

import importlib

_NAMES = {
    "run_batch_file": "workbench.jobs.batch_file",
    "BatchRunner": "workbench.jobs.batch_file",
    "CaptureJob": "workbench.jobs.capture",
    "CaptureReader": "workbench.jobs.reader",
    "open_capture": "workbench.jobs.reader",
    "train_sae": "workbench.jobs.sae_training",
    "TrainedSAE": "workbench.jobs.sae_training",
    "DashboardJob": "workbench.jobs.dashboards",
}


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench.jobs' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_NAMES)
