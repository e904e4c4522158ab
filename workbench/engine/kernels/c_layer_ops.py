"""The small operators between the projections in C (`csrc/layer_ops.c`): a residual add with the
RMSNorm after it, rotary embedding with the KV write, SiLU gating; float32 and bfloat16; and the
sampler's ranks and top-k of a step's logprobs. None where the C library or the layout is not
there (the caller falls back to torch's ops).
"""

from __future__ import annotations

import functools

import torch

from workbench.engine.kernels import c_library
from workbench.models.cpu import cpu_features

_DTYPES = (torch.float32, torch.bfloat16)  # what the C functions compute in


def add_rms_norm(hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A pre-norm layer's residual add and RMSNorm in one pass (`wb_add_rms_norm`): hidden,
    delta [M, H] contiguous, weight [H], all float32 or all bfloat16 -> (hidden + delta, or
    hidden itself without delta; transformers' RMSNorm of that with `weight`). None where the C
    function does not take them (another dtype or layout, a hidden size not a multiple of 8)."""
    m, h = hidden.shape
    if not (hidden.dtype == weight.dtype in _DTYPES and hidden.is_contiguous()
            and (delta is None or (delta.dtype == hidden.dtype and delta.is_contiguous()))):
        return None
    out = torch.empty_like(hidden) if delta is not None else hidden
    normed = torch.empty_like(hidden)
    code = c_library.function("wb_add_rms_norm")(
        hidden.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(),
        out.data_ptr(), normed.data_ptr(), m, h, eps, hidden.dtype == torch.bfloat16,
        torch.get_num_threads())
    return (out, normed) if code == 0 else None


def rope_write_kv(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                  slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  num_heads: int, num_kv_heads: int) -> torch.Tensor | None:
    """A step's rotary embedding and KV-cache write in one pass (`wb_rope_write_kv`): qkv
    [T, (Hq + 2 Hkv) D] (rows may be strided), cos and signed_sin [T, D] (the decoder's
    `_signed_sin`), slots [T] int64 -> the rotated queries [T, Hq, D]; the rotated keys and the
    values are written at `slots` of k_cache and v_cache [S, Hkv, D]. Bit for bit the
    decoder's `_rotate` and `index_copy_`. None where the C function does not take them (other
    dtypes or layouts, a head size not a multiple of 16): the caller computes it otherwise."""
    t, width = qkv.shape
    d = k_cache.shape[-1]
    if not (qkv.dtype == cos.dtype == signed_sin.dtype == k_cache.dtype == v_cache.dtype
            in _DTYPES and qkv.stride(1) == 1 and cos.is_contiguous()
            and signed_sin.is_contiguous() and slots.dtype == torch.int64
            and slots.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous()
            and width == (num_heads + 2 * num_kv_heads) * d and cos.shape == (t, d)):
        return None
    q = torch.empty((t, num_heads, d), dtype=qkv.dtype)
    code = c_library.function("wb_rope_write_kv")(
        qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), signed_sin.data_ptr(), slots.data_ptr(),
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), t, num_heads, num_kv_heads, d,
        qkv.dtype == torch.bfloat16, torch.get_num_threads())
    return q if code == 0 else None


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """`silu(gate) * up` of a fused gate/up projection's output [M, 2F] (`wb_silu_mul`) ->
    [M, F], as torch's two ops within the last bit of silu's exp. None where the C function does
    not take it (another dtype or layout, F not a multiple of 8)."""
    m, width = gate_up.shape
    if not (gate_up.dtype in _DTYPES and gate_up.is_contiguous()):
        return None
    out = torch.empty((m, width // 2), dtype=gate_up.dtype)
    code = c_library.function("wb_silu_mul")(gate_up.data_ptr(), out.data_ptr(), m, width // 2,
                             gate_up.dtype == torch.bfloat16, torch.get_num_threads())
    return out if code == 0 else None


@functools.cache
def _library_runs() -> bool:
    """Whether this CPU runs the C library (AVX2 and FMA) and it built."""
    return cpu_features().has("avx2", "fma") and c_library.library() is not None


def ranks_and_top_k(logprobs: torch.Tensor, chosen: torch.Tensor, k: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """One pass over each row of float32 logprobs [R, V] (`wb_ranks_top_k`): the chosen tokens'
    ranks [R] (1 + how many exceed theirs), and the top `k` (ids [R, k], values [R, k]),
    largest first, an equal value after those of lower index. torch's `topk` and a compare-and-
    sum take 4-5x as long on a 49k vocabulary (a small model's decode step 2-3 % slower with 5
    logprobs). None (the caller uses torch's ops) for another dtype or layout, k outside 1-64,
    or a NaN."""
    if not (_library_runs() and logprobs.dtype == torch.float32 and logprobs.dim() == 2
            and logprobs.is_contiguous() and logprobs.device.type == "cpu" and 1 <= k <= 64):
        return None
    rows = logprobs.shape[0]
    chosen = chosen.to(torch.int64).contiguous()
    ranks = torch.empty(rows, dtype=torch.int64)
    ids = torch.empty(rows, k, dtype=torch.int64)
    values = torch.empty(rows, k, dtype=torch.float32)
    code = c_library.function("wb_ranks_top_k")(
        logprobs.data_ptr(), chosen.data_ptr(), rows, logprobs.shape[1], k, ranks.data_ptr(),
        ids.data_ptr(), values.data_ptr())
    return (ranks, ids, values) if code == 0 else None


def entropy(logprobs: torch.Tensor) -> torch.Tensor | None:
    """The entropy in nats of each row of float32 logprobs [R, V] (`wb_entropy`): one pass, each
    term in float32 as torch's `exp() * l` within its exp's last bits, summed in float64 in one
    order per row (a row alone or in a batch, any thread count: the same bits) -> float64 [R].
    torch's exp, multiply, NaN mask and a one-order sum took ~0.12 ms a row on a 49k
    vocabulary, this ~0.04. None (the caller uses torch's) for another dtype, layout or device,
    or a NaN or +inf."""
    if not (_library_runs() and logprobs.dtype == torch.float32 and logprobs.dim() == 2
            and logprobs.is_contiguous() and logprobs.device.type == "cpu"):
        return None
    out = torch.empty(logprobs.shape[0], dtype=torch.float64)
    code = c_library.function("wb_entropy")(logprobs.data_ptr(), logprobs.shape[0],
                                            logprobs.shape[1], out.data_ptr(),
                                            torch.get_num_threads())
    return out if code == 0 else None
