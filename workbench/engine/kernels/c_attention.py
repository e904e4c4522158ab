"""Attention in C (`csrc/attention.c`): one query token per sequence against its context read in
place through the KV cache's slots (decode), and every query token alone against its own
context (paged, the batch-invariant path), with windows, soft-capping and ALiBi; float32 and
bfloat16. None where the C library or the layout is not there (the caller falls back to torch).
"""

from __future__ import annotations

import torch

from workbench.engine.kernels import c_library

_DTYPES = (torch.float32, torch.bfloat16)  # what the C functions compute in


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     slots: torch.Tensor, lengths: torch.Tensor, scale: float
                     ) -> torch.Tensor | None:
    """One query token per sequence against its context, read in place through its cache slots
    (`wb_decode_attention`): q [B, Hq, D]; k_cache, v_cache [S, Hkv, D]; slots [B, Lmax] int64
    (row b's first lengths[b] are its context); lengths [B] int64 -> [B, Hq, D] in q's dtype
    (float32 or bfloat16, the caches' too; q and slots may be row slices of larger tensors).
    None where the C function does not take the shape (another dtype, a head size that is not a
    multiple of 8, more than 256 or over 16 query heads per KV head): the caller computes it
    otherwise."""
    b, hq, d = q.shape
    if not q.dtype == k_cache.dtype == v_cache.dtype in _DTYPES:
        return None
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    if slots.stride(1) != 1:
        slots = slots.contiguous()
    out = torch.empty((b, hq, d), dtype=q.dtype)
    code = c_library.function("wb_decode_attention")(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
        slots.stride(0), lengths.data_ptr(), out.data_ptr(), b, hq, k_cache.shape[1], d,
        slots.shape[1], scale, q.dtype == torch.bfloat16, torch.get_num_threads())
    return out if code == 0 else None


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slots: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                    max_length: int, scale: float, window: int | None = None,
                    softcap: float | None = None, alibi: torch.Tensor | None = None,
                    alibi_scale: float = 1.0) -> torch.Tensor | None:
    """Every query token against its own context, read in place through the cache slots
    (`wb_paged_attention`, the batch-invariant engine's attention): q [T, Hq, D]; k_cache,
    v_cache [S, Hkv, D]; query t at position lengths[t] - 1 reads the keys in slots
    slots[offsets[t]:offsets[t] + lengths[t]] (int64; max_length: the longest), its last `window`,
    scores soft-capped at `softcap`, ALiBi `alibi` [Hq] float32 slopes (times `alibi_scale`)
    -> [T, Hq, D] in q's dtype. None where the C function does not take the shape (as
    `decode_attention`)."""
    t, hq, d = q.shape
    if not q.dtype == k_cache.dtype == v_cache.dtype in _DTYPES:
        return None
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    if alibi is not None:
        alibi = alibi.float().contiguous()
    out = torch.empty((t, hq, d), dtype=q.dtype)
    code = c_library.function("wb_paged_attention")(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
        offsets.data_ptr(), lengths.data_ptr(), window or 0, softcap or 0.0,
        None if alibi is None else alibi.data_ptr(), alibi_scale, out.data_ptr(), t, hq,
        k_cache.shape[1], d, max_length, scale, q.dtype == torch.bfloat16,
        torch.get_num_threads())
    return out if code == 0 else None
