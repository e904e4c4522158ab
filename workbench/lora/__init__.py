"""LoRA adapters: per-request PEFT adapters on the engine, and their serving rules.

- `request.py`   `LoRARequest` (vLLM's names), torch-free
- `adapter.py`   PEFT directory -> checked weights (`load_adapter`, `LoRALoadError`)
- `layers.py`    `LoRALinear`: per-row adapter deltas in a mixed batch, fused projections too
- `manager.py`   `LoRAManager`: loaded adapters (LRU) and `max_loras` resident slots (LRU)
- `resolver.py`  `LoRAResolver` and the local-directory `FilesystemResolver`
- `serving.py`   `ServedAdapters`: names -> adapters for the server (static, runtime, resolved,
                 default per content type), load / unload with the reference's messages
- `compare.py`   `compare_lora`: base vs adapter on one prompt, with a `LogprobTable` diff
"""

from __future__ import annotations

import importlib

from workbench.lora.request import LoRARequest

_LAZY = {
    "LoRAManager": "workbench.lora.manager",
    "LoRALoadError": "workbench.lora.adapter",
    "LoRANotFoundError": "workbench.lora.adapter",
    "load_adapter": "workbench.lora.adapter",
    "LoRAResolver": "workbench.lora.resolver",
    "FilesystemResolver": "workbench.lora.resolver",
    "ServedAdapters": "workbench.lora.serving",
    "compare_lora": "workbench.lora.compare",
    "LoRAComparison": "workbench.lora.compare",
}

__all__ = ["LoRARequest", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'workbench.lora' has no attribute {name!r}")
