"""LoRA adapters as data and layers, below the engine (they import nothing of it):

- `request.py`   `LoRARequest` (vLLM's names), torch-free
- `adapter.py`   PEFT directory -> checked weights (`load_adapter`, `LoRALoadError`)
- `layers.py`    `LoRALinear`: per-row adapter deltas in a mixed batch, fused projections too
- `resolver.py`  `LoRAResolver` and the local-directory `FilesystemResolver`

Who uses them, one layer up each: the engine's `engine/step/lora_manager.py` (`LoRAManager`,
`attach`), the server's `serving/lora.py` (`ServedAdapters`), and `inspect/lora_compare.py`
(`compare_lora`).
"""

from __future__ import annotations

import importlib

from workbench.lora.request import LoRARequest

_LAZY = {
    "LoRALoadError": "workbench.lora.adapter",
    "LoRANotFoundError": "workbench.lora.adapter",
    "load_adapter": "workbench.lora.adapter",
    "LoRAResolver": "workbench.lora.resolver",
    "FilesystemResolver": "workbench.lora.resolver",
}

__all__ = ["LoRARequest", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'workbench.lora' has no attribute {name!r}")
