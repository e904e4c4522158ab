"""Triton kernels for the CUDA path: paged attention over the block tables, and the small fused
ops between a layer's projections (residual add + RMSNorm, rotary + KV write, SiLU gating).

The kernels live in `attention.py` and `ops.py`, which import triton at their top: import them
only once `available(device)` says yes (the engine imports fine where triton is absent, a CPU
machine without it or macOS). On CPU tensors they run under Triton's interpreter
(`TRITON_INTERPRET=1`, read by `triton.jit` when those modules are first imported), which is
how `tests/engine/gpu/test_triton_kernels.py` checks them without a GPU. Nothing in the engine
calls them yet: each kernel's docstring says what it replaces and how the GPU wiring will call
it.
"""

from __future__ import annotations

import functools
import os

import torch


def interpreting() -> bool:
    """Whether `TRITON_INTERPRET` asks for Triton's interpreter (read as triton reads it)."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on")


@functools.cache
def imports() -> bool:
    """Whether triton imports here (it ships with CUDA torch; on CPU it is a test dependency)."""
    try:
        import triton  # noqa: F401  (deferred: optional, and seconds to import)
    except ImportError:
        return False
    return True


def available(device: torch.device | str) -> bool:
    """Whether the Triton kernels can run on tensors of `device`: triton imports, and the device
    is CUDA (compiled kernels) or `TRITON_INTERPRET=1` (interpreted, on any device)."""
    return imports() and (torch.device(device).type == "cuda" or interpreting())
