"""A decode step through every layer in one C call (`csrc/decode_stack.c`): `stack_table` lays
out each layer's tensors and product functions once, `decode_stack` runs the step on them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import torch

from workbench.engine.kernels import c_library

_DTYPES = (torch.float32, torch.bfloat16)  # what the C functions compute in


STACK_TENSORS = 12  # per layer, the tensors `decode_stack` reads (csrc/decode_stack.c's order)
STACK_FUNCTIONS = 4  # and the product functions of its four projections


def stack_table(layers: Sequence[tuple[Any, ...]], eps: Sequence[tuple[float, float]]
                ) -> tuple[Any, Any]:
    """`decode_stack`'s tables: per layer its `STACK_TENSORS` tensors in csrc/decode_stack.c's
    order (the input norm's weight, Q/K/V's weight and bias, O's, the post-attention norm's
    weight, gate/up's, down's, the K and V caches; None for a missing bias), then the product
    functions of Q/K/V, O, gate/up and down (ctypes functions, each on its weight's layout), and
    its two norms' epsilons. The caller keeps the tensors alive as long as the tables."""
    width = STACK_TENSORS + STACK_FUNCTIONS
    if any(len(layer) != width for layer in layers):
        raise ValueError(f"each layer takes {STACK_TENSORS} tensors and {STACK_FUNCTIONS} "
                         "functions")
    flat = [None if t is None else t.data_ptr() for layer in layers
            for t in layer[:STACK_TENSORS]]
    flat = [address for i, layer in enumerate(layers) for address in (
        flat[i * STACK_TENSORS:(i + 1) * STACK_TENSORS]
        + [ctypes.cast(fn, ctypes.c_void_p).value for fn in layer[STACK_TENSORS:]])]
    return ((ctypes.c_void_p * len(flat))(*flat),
            (ctypes.c_float * (2 * len(eps)))(*(e for pair in eps for e in pair)))


def decode_stack(tables: tuple[Any, Any], num_layers: int, hidden: torch.Tensor,
                 cos: torch.Tensor, signed_sin: torch.Tensor, slot_mapping: torch.Tensor,
                 slots: torch.Tensor, lengths: torch.Tensor, num_heads: int, num_kv_heads: int,
                 head_dim: int, intermediate: int, scale: float, first: int = 0
                 ) -> torch.Tensor | None:
    """A decode step through `num_layers` layers in one C call (`wb_decode_stack`), the
    tables' layers from `first` on (a stack cut where an inspection reads or changes the
    residual stream: `decoder.DecoderStack._c_segments`): hidden [T, H]
    (one token per sequence), cos and signed_sin [T, D], slot_mapping [T], slots [T, Lmax] and
    lengths [T] as `rope_write_kv` and `decode_attention` take them, each projection through
    the function its table names -> [T, H] before the final norm, bit for bit the decoder's
    loop over the same C functions. None where a function refused the shapes (nothing then is
    half done that the loop would not redo)."""
    t, h = hidden.shape
    d = head_dim
    if not (hidden.is_contiguous() and cos.is_contiguous() and signed_sin.is_contiguous()
            and cos.shape == signed_sin.shape == (t, d) and slots.shape[0] == t
            and hidden.dtype == cos.dtype == signed_sin.dtype in _DTYPES
            and slot_mapping.dtype == slots.dtype == lengths.dtype == torch.int64
            and slot_mapping.is_contiguous() and lengths.is_contiguous()
            and slots.stride(1) == 1):
        return None
    out = torch.empty_like(hidden)
    layers, eps = tables
    if first:  # the tables from layer `first` on: the same arrays, further in
        width = STACK_TENSORS + STACK_FUNCTIONS
        layers = ctypes.addressof(layers) + first * width * ctypes.sizeof(ctypes.c_void_p)
        eps = ctypes.addressof(eps) + first * 2 * ctypes.sizeof(ctypes.c_float)
    code = c_library.function("wb_decode_stack")(
        layers, eps, num_layers, hidden.data_ptr(), out.data_ptr(), cos.data_ptr(),
        signed_sin.data_ptr(), slot_mapping.data_ptr(), slots.data_ptr(), slots.stride(0),
        lengths.data_ptr(), slots.shape[1], t, h, num_heads, num_kv_heads, d, intermediate,
        scale, hidden.dtype == torch.bfloat16, torch.get_num_threads())
    return out if code == 0 else None
