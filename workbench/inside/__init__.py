"""What a request sees and changes inside the model, by TransformerLens's names.

`params` (what a request asks: `CaptureParams`, `LogitLensParams`, `Intervention`), the views
of what the engine recorded (`ActivationCache`, `AttentionPattern`, `LogitLens`), and `tensors`,
the wire form of their arrays over HTTP. Plain data, below the engine and the serving layer,
which build and send them; names load lazily (no pandas or matplotlib at import).
"""

from __future__ import annotations

import importlib

_NAMES = {
    "ActivationCache": "workbench.inside.activations",
    "AttentionPattern": "workbench.inside.attention_pattern",
    "LogitLens": "workbench.inside.logit_lens",
    "encode_tensor": "workbench.inside.tensors",
    "decode_tensor": "workbench.inside.tensors",
    "decode_array": "workbench.inside.tensors",
}


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench.inside' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_NAMES)
