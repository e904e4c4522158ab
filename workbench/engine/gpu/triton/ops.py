"""The small ops between a decoder layer's projections as Triton kernels, for the CUDA path.

On CUDA the lean loop (`engine/step/decoder.py`) runs these as torch's ops, several launches each:
the residual add and the RMSNorm after it (`_add_norm`: add, cast, rms_norm, cast, multiply),
rotary embedding and the KV write (`_rotate`: chunk, two products, cat, add; then
`attend`'s two `index_copy_`), SiLU gating (chunk, silu, multiply). Each function here is one
launch computing what `engine/kernels/c_layer_ops.py`'s C function of the same name computes
on CPU, with torch's roundings in the tensor's dtype (float32, bfloat16, float16): every intermediate that torch
rounds to that dtype is rounded here too (`rounding.round_to`), in float32 between, and no
product is fused into an FMA (`enable_fp_fusion=False`: torch's separate ops round each), so
rotary + KV write is bit for bit torch's in every dtype.

Launch grids come from shapes alone and nothing reads a tensor on the host, so a CUDA graph can
capture them; a negative slot in `slot_mapping` (a padding row of a captured batch) writes
nothing. Import this module only once `workbench.engine.gpu.triton.available` says yes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.engine.gpu.triton.rounding import round_to, rounded

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _add_rms_norm_kernel(hidden_ptr, delta_ptr, weight_ptr, sum_ptr, normed_ptr, stride_hidden,
                         stride_delta, stride_sum, stride_normed, size, eps,
                         HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < size
    dtype = normed_ptr.dtype.element_ty
    x = tl.load(hidden_ptr + row * stride_hidden + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:  # the sum rounded to the dtype (torch's add), what the norm reads
        delta = tl.load(delta_ptr + row * stride_delta + cols, mask=mask, other=0.0)
        x = rounded(x + delta.to(tl.float32), dtype)
        tl.store(sum_ptr + row * stride_sum + cols, round_to(x, dtype), mask=mask)
    mean = tl.div_rn(tl.sum(x * x, axis=0), size * 1.0)  # (size: a constant when 1)
    inverse = tl.div_rn(1.0, tl.sqrt_rn(mean + eps))
    normed = rounded(x * inverse, dtype)  # transformers' RMSNorm: cast back, then scale
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(normed_ptr + row * stride_normed + cols, round_to(normed * weight, dtype),
             mask=mask)


def add_rms_norm(hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-norm layer's residual add and RMSNorm in one launch: hidden, delta [M, H] (rows may
    be strided), weight [H], one dtype -> (hidden + delta, or hidden itself without delta;
    transformers' RMSNorm of that with `weight`), as `c_layer_ops.add_rms_norm` on CPU.

    Replaces, on CUDA, `DecoderStack._add_norm`'s torch ops (`hidden + delta`, then
    `decoder._rms_norm`): the GPU wiring calls it there in place of `c_layer_ops.add_rms_norm`.
    """
    m, size = hidden.shape
    _check_rows("hidden", hidden, size)
    if delta is not None:
        _check_rows("delta", delta, size, hidden)
    if weight.shape != (size,) or weight.dtype != hidden.dtype or weight.stride(0) != 1:
        raise ValueError(f"weight must be a contiguous [{size}] tensor in {hidden.dtype}, not "
                         f"{tuple(weight.shape)} in {weight.dtype}")
    out = hidden if delta is None else torch.empty_like(hidden, memory_format=torch.contiguous_format)
    normed = torch.empty((m, size), dtype=hidden.dtype, device=hidden.device)
    if m:
        _add_rms_norm_kernel[(m,)](
            hidden, hidden if delta is None else delta, weight, out, normed, hidden.stride(0),
            0 if delta is None else delta.stride(0), out.stride(0), normed.stride(0), size,
            eps, HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(size),
            enable_fp_fusion=False)
    return out, normed


@triton.jit
def _rope_write_kv_kernel(qkv_ptr, cos_ptr, sin_ptr, slots_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
                          stride_qkv, stride_cos, stride_sin, stride_q_token, stride_q_head,
                          stride_k_slot, stride_k_head, stride_v_slot, stride_v_head,
                          num_heads, num_kv_heads, head_dim, BLOCK_D: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # queries, then keys, then values: the fused row's order
    d = tl.arange(0, BLOCK_D)
    mask = d < head_dim
    dtype = q_ptr.dtype.element_ty
    row = qkv_ptr + token * stride_qkv + head * head_dim
    x = tl.load(row + d, mask=mask, other=0.0).to(tl.float32)
    slot = tl.load(slots_ptr + token).to(tl.int64)
    # a negative slot (a padded row) writes nothing (a bound, not `mask & (slot >= 0)`: the
    # interpreter's `&` of a block and a scalar yields integers, which `tl.store` refuses)
    written = d < tl.where(slot >= 0, head_dim, 0)
    if head < num_heads + num_kv_heads:  # rotated: x * cos + rotate_half(x) * signed_sin
        half = head_dim // 2
        partner = tl.where(d < half, d + half, d - half)
        r = tl.load(row + partner, mask=mask, other=0.0).to(tl.float32)
        c = tl.load(cos_ptr + token * stride_cos + d, mask=mask, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + token * stride_sin + d, mask=mask, other=0.0).to(tl.float32)
        y = round_to(rounded(x * c, dtype) + rounded(r * s, dtype), dtype)
        if head < num_heads:
            tl.store(q_ptr + token * stride_q_token + head * stride_q_head + d, y, mask=mask)
        else:
            kv_head = head - num_heads
            tl.store(k_cache_ptr + slot * stride_k_slot + kv_head * stride_k_head + d, y,
                     mask=written)
    else:
        kv_head = head - num_heads - num_kv_heads
        tl.store(v_cache_ptr + slot * stride_v_slot + kv_head * stride_v_head + d,
                 round_to(x, dtype), mask=written)


def rope_write_kv(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                  slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """A step's rotary embedding and KV-cache write in one launch: qkv [T, (Hq + 2 Hkv) D] (the
    fused projection's output; rows may be strided), cos and signed_sin [T, D] (sin with its
    first half negated: `decoder._signed_sin`), slot_mapping [T] (int32 or int64; negative:
    not written) -> the rotated queries [T, Hq, D]; the rotated keys and the values are written
    at the slots of k_cache and v_cache [S, Hkv, D]. Each element is `x * cos +
    rotate_half(x) * signed_sin` with torch's roundings (the products, then their sum), as
    `decoder._rotate` and `c_layer_ops.rope_write_kv`.

    Replaces, on CUDA, the lean loop's `_rotate` on the queries and keys and `attend`'s two
    `index_copy_` into the layer's cache: the GPU wiring calls it where `DecoderStack.__call__`
    calls `c_layer_ops.rope_write_kv`, then `attend(ctx, i, q, None, None, ...)`.
    """
    t, width = qkv.shape
    d = k_cache.shape[-1]
    _check_rows("qkv", qkv, width)
    if width != (num_heads + 2 * num_kv_heads) * d or d % 2:
        raise ValueError(f"qkv rows of {width} do not hold {num_heads} query and {num_kv_heads} "
                         f"key and value heads of an even size {d}")
    for name, table in (("cos", cos), ("signed_sin", signed_sin)):
        if table.shape != (t, d) or table.dtype != qkv.dtype or table.stride(1) != 1:
            raise ValueError(f"{name} must be [{t}, {d}] in {qkv.dtype} with contiguous rows, "
                             f"not {tuple(table.shape)} in {table.dtype}")
    _check_cache(k_cache, v_cache, num_kv_heads, d, qkv.dtype)
    if slot_mapping.shape != (t,) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping must be [{t}] int32 or int64, not "
                         f"{tuple(slot_mapping.shape)} in {slot_mapping.dtype}")
    q = torch.empty((t, num_heads, d), dtype=qkv.dtype, device=qkv.device)
    if t:
        _rope_write_kv_kernel[(t, num_heads + 2 * num_kv_heads)](
            qkv, cos, signed_sin, slot_mapping, q, k_cache, v_cache, qkv.stride(0),
            cos.stride(0), signed_sin.stride(0), q.stride(0), q.stride(1), k_cache.stride(0),
            k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), num_heads, num_kv_heads,
            d, BLOCK_D=triton.next_power_of_2(d), enable_fp_fusion=False)
    return q


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, stride_in, stride_out, size, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < size
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + size + cols, mask=mask, other=0.0)
    silu = rounded(tl.div_rn(gate, 1.0 + tl.exp(-gate)), dtype)  # torch's silu, rounded
    tl.store(out_ptr + row * stride_out + cols, round_to(silu * up.to(tl.float32), dtype),
             mask=mask)


def silu_mul(gate_up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """`silu(gate) * up` of a fused gate/up projection's output [M, 2F] (gate, then up, per
    row; rows may be strided) -> [M, F], in one launch: silu rounded to the dtype, then the
    product, as torch's two ops and `c_layer_ops.silu_mul`.

    Replaces, on CUDA, the lean loop's `gate, up = gate_up.chunk(2, dim=-1); act(gate) * up`
    (for SiLU layers, `DecoderStack.silu`): the GPU wiring calls it where
    `DecoderStack.__call__` calls `c_layer_ops.silu_mul`.
    """
    m, width = gate_up.shape
    _check_rows("gate_up", gate_up, width)
    if width % 2:
        raise ValueError(f"gate_up rows of {width} do not split into gate and up halves")
    size = width // 2
    out = torch.empty((m, size), dtype=gate_up.dtype, device=gate_up.device)
    block = min(block, triton.next_power_of_2(max(size, 1)))
    if m and size:
        _silu_mul_kernel[(m, triton.cdiv(size, block))](gate_up, out, gate_up.stride(0),
                                                        out.stride(0), size, BLOCK=block,
                                                        enable_fp_fusion=False)
    return out


def _check_rows(name: str, x: torch.Tensor, width: int, like: torch.Tensor | None = None):
    """x: [M, width] in one of `DTYPES`, contiguous within rows (and as `like`, when given)."""
    if x.dim() != 2 or x.shape[1] != width or x.dtype not in DTYPES or (
            x.shape[1] > 1 and x.stride(1) != 1):
        raise ValueError(f"{name} must be [rows, {width}] in one of {DTYPES} with contiguous "
                         f"rows, not {tuple(x.shape)} in {x.dtype}")
    if like is not None and (x.shape != like.shape or x.dtype != like.dtype
                             or x.device != like.device):
        raise ValueError(f"{name} must match {tuple(like.shape)} in {like.dtype} on "
                         f"{like.device}, not {tuple(x.shape)} in {x.dtype} on {x.device}")


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype) -> None:
    """k_cache and v_cache: [S, Hkv, D] in `dtype`, each head's D contiguous."""
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if (cache.dim() != 3 or cache.shape[1:] != (num_kv_heads, head_dim)
                or cache.dtype != dtype or cache.stride(2) != 1):
            raise ValueError(f"{name} must be [slots, {num_kv_heads}, {head_dim}] in {dtype} "
                             f"with contiguous heads, not {tuple(cache.shape)} in {cache.dtype}")
