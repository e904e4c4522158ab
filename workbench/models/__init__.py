"""Models: names resolved to directories, loaded for inference, and tiny ones for tests.

>>> from workbench.models import resolve_model
>>> resolve_model("smollm2-135m-instruct", prepare=False).kind
'generate'

`load_model` and `tiny_model` import torch and transformers; `resolve_model` does not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from workbench.models.cache import cache_dir, model_cache_dir
from workbench.models.registry import (
    ALIASES,
    DEFAULT_EMBED_MODEL,
    DEFAULT_MODEL,
    ModelSpec,
    resolve_model,
)

if TYPE_CHECKING:
    from workbench.models.devices import resolve_device, resolve_dtype
    from workbench.models.loader import LoadedModel, load_model
    from workbench.models.tiny import TINY_ARCHITECTURES, tiny_model

_LAZY = {
    "resolve_device": "workbench.models.devices", "resolve_dtype": "workbench.models.devices",
    "LoadedModel": "workbench.models.loader", "load_model": "workbench.models.loader",
    "tiny_model": "workbench.models.tiny", "TINY_ARCHITECTURES": "workbench.models.tiny",
}

__all__ = ["ALIASES", "DEFAULT_EMBED_MODEL", "DEFAULT_MODEL", "LoadedModel", "ModelSpec",
           "TINY_ARCHITECTURES", "cache_dir", "load_model", "model_cache_dir", "resolve_device",
           "resolve_dtype", "resolve_model", "tiny_model"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'workbench.models' has no attribute {name!r}")
