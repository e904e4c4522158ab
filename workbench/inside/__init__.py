"""The inside of the model, for one request: what it asks to see or change, and what it got.

In the order of a request's life: `sites` (TransformerLens's names of the hook points),
`positions` (which tokens: one form and one parser for every field), `spec` (the request's
`capture`, `logit_lens` and `interventions` as given, parsed: `CaptureParams`,
`LogitLensParams`, `Intervention`), `vectors` (an intervention's vector inline or from a file),
`resolve` (checked against the model once per request: an `Inside`, kept on the params),
`recorded` (what the engine hands back: `ActivationData`, `LogitLensData`, and their wire form)
and `tensors` (arrays over HTTP). Plain data below the engine and the serving layer; no pandas,
matplotlib or HTML here: the views (`ActivationCache`, `AttentionPattern`, `LogitLens`) are in
`workbench.inspect` with the other inspect objects.

Names load lazily. `ActivationCache`, `AttentionPattern` and `LogitLens` are still answered
here for notebooks written before the views moved: at attribute access, from
`workbench.inspect` (nothing in the package imports them from here).
"""

from __future__ import annotations

import importlib

_NAMES = {
    "encode_tensor": "workbench.inside.tensors",
    "decode_tensor": "workbench.inside.tensors",
    "decode_array": "workbench.inside.tensors",
    "CaptureParams": "workbench.inside.spec",
    "LogitLensParams": "workbench.inside.spec",
    "Intervention": "workbench.inside.spec",
    "Positions": "workbench.inside.positions",
    "parse_positions": "workbench.inside.positions",
    "ActivationData": "workbench.inside.recorded",
    "LogitLensData": "workbench.inside.recorded",
}
_MOVED = {  # the views, now in workbench.inspect
    "ActivationCache": "workbench.inspect.activations",
    "AttentionPattern": "workbench.inspect.attention_pattern",
    "LogitLens": "workbench.inspect.logit_lens",
}


def __getattr__(name: str):
    module = _NAMES.get(name) or _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench.inside' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_NAMES)
