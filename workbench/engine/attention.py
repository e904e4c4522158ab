"""Paged attention for transformers' own decoder layers, over our block-table KV cache.

`paged_attention` is registered with transformers' `AttentionInterface`, so a stock
`LlamaDecoderLayer` (or Qwen2, Mistral) calls it in place of SDPA. Every step packs all scheduled
tokens of all sequences into one ragged row (`[1, T, hidden]`, no padding in the linear layers);
the step's `AttentionContext`, built once and passed down as a keyword argument, says where each
token's K/V goes (`slot_mapping`) and which cached slots each query reads.

Decode tokens (one query per sequence) are attended together: in C, reading each context in
place through its slots (`gemv.decode_attention`, where the kernel choice's ops are "c"), else in
one SDPA call over their gathered contexts, padded to the longest (a lone decode whose blocks
are consecutive reads its context as a view of the cache instead). Each prefill chunk gets its
own causal SDPA call. Called without a context, it is plain SDPA, so the same model object still
works with `generate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from workbench.engine import gemv

ATTENTION_NAME = "workbench_paged"


@dataclass
class PrefillChunk:
    start: int  # first of its query tokens in the packed row
    num_tokens: int  # query tokens this step
    slots: torch.Tensor  # [L] cache slots of its whole context (cached prefix + this chunk)
    mask: torch.Tensor | None  # [num_tokens, L] bool, None when plainly causal (no prefix)


@dataclass
class AttentionContext:
    """Where the step's tokens' K/V go and what each query attends to (built once per step)."""

    slot_mapping: torch.Tensor  # [T] cache slot of each packed token
    num_decode: int  # the first num_decode tokens are single-token decodes
    decode_slots: torch.Tensor | None  # [B, Lmax] cache slots of each decode's context
    decode_mask: torch.Tensor | None  # [B, Lmax] bool, True = attend; None: no padding
    prefills: list[PrefillChunk]
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: ([S, Hkv, D], [S, Hkv, D])
    # (first slot, Lmax) when the only decode's context is one run of slots (its blocks are
    # consecutive, as a lone stream's usually are): read as a view of the cache, no gather
    decode_span: tuple[int, int] | None = None
    decode_lengths: torch.Tensor | None = None  # [B] int64: each decode's context length
    c_attention: bool = False  # decodes through gemv.decode_attention (`KernelChoice.ops`)
    decode_flat_slots: torch.Tensor | None = field(init=False)  # [B * Lmax], gathered per layer

    def __post_init__(self):
        self.decode_flat_slots = None if self.decode_slots is None else \
            self.decode_slots.flatten()


def paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                    wb_ctx: AttentionContext | None = None, **kwargs):
    """query: [1, Hq, T, D]; key/value: [1, Hkv, T, D] -> ([1, T, Hq, D], None).

    Without a context (the model called by `generate` or a plain forward) it is transformers' SDPA.
    """
    if wb_ctx is None:
        # deferred: transformers takes seconds to import, and only a forward without our
        # context (plain transformers use of the model) needs this
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, dropout=dropout, **kwargs)
    out = attend(wb_ctx, module.layer_idx, query[0].transpose(0, 1), key[0].transpose(0, 1),
                 value[0].transpose(0, 1), scaling)
    return out.unsqueeze(0), None


def attend(ctx: AttentionContext, layer_idx: int, q: torch.Tensor, k: torch.Tensor | None,
           v: torch.Tensor | None, scaling: float | None) -> torch.Tensor:
    """Writes the step's K/V into layer `layer_idx`'s cache (unless k and v are None: already
    written), then attends every query to its context. q: [T, Hq, D]; k, v: [T, Hkv, D] ->
    [T, Hq, D]."""
    k_cache, v_cache = ctx.kv_caches[layer_idx]
    if k is not None and v is not None:  # written first, so that the reads below see them
        k_cache.index_copy_(0, ctx.slot_mapping, k)
        v_cache.index_copy_(0, ctx.slot_mapping, v)
    nd = ctx.num_decode
    if nd == q.shape[0]:  # decodes only (every step of plain generation): no output to splice
        return _attend_decodes(ctx, q, k_cache, v_cache, scaling)
    out = torch.empty_like(q)  # [T, Hq, D]
    if nd:
        out[:nd] = _attend_decodes(ctx, q[:nd], k_cache, v_cache, scaling)
    for chunk in ctx.prefills:
        s, n = chunk.start, chunk.num_tokens
        kp = k_cache.index_select(0, chunk.slots).transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
        vp = v_cache.index_select(0, chunk.slots).transpose(0, 1).unsqueeze(0)
        qp = q[s:s + n].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
        o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=chunk.mask, scale=scaling,
                                           is_causal=chunk.mask is None, enable_gqa=True)
        out[s:s + n] = o[0].transpose(0, 1)
    return out


def _attend_decodes(ctx: AttentionContext, qd: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """The decode queries qd [B, Hq, D] against their gathered contexts -> [B, Hq, D]."""
    assert ctx.decode_slots is not None and ctx.decode_flat_slots is not None  # decodes run
    scale = scaling or qd.shape[-1] ** -0.5
    if ctx.c_attention and ctx.decode_lengths is not None:
        out = gemv.decode_attention(qd, k_cache, v_cache, ctx.decode_slots, ctx.decode_lengths,
                                    scale)
        if out is not None:
            return out
    shape = (*ctx.decode_slots.shape, *k_cache.shape[1:])  # [B, Lmax, Hkv, D]
    if ctx.decode_span is not None:
        first, length = ctx.decode_span
        kd = k_cache[first:first + length].view(shape)
        vd = v_cache[first:first + length].view(shape)
    else:
        flat = ctx.decode_flat_slots  # index_select: faster than k_cache[slots] here
        kd = k_cache.index_select(0, flat).view(shape)
        vd = v_cache.index_select(0, flat).view(shape)
    return decode_attention(qd, kd, vd, ctx.decode_mask, scale)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """One query per sequence against its gathered context, grouped-query aware.

    q: [B, Hq, D]; k, v: [B, L, Hkv, D]; mask: [B, L] or None (no padding) -> [B, Hq, D].
    The G = Hq / Hkv query heads sharing a KV head are laid out as G query positions of that
    head, so SDPA sees a plain [B, Hkv, G, D] x [B, Hkv, L, D] attention without masking
    between them (query head h reads KV head h // G, as transformers' `repeat_kv`). On CPU
    this is several times faster than SDPA's own GQA path or two explicit matmuls.
    """
    b, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.reshape(b, hkv, hq // hkv, d)  # [B, Hkv, G, D]
    attn_mask = None if mask is None else mask[:, None, None, :]  # [B, 1, 1, L]
    out = F.scaled_dot_product_attention(qg, k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=attn_mask, scale=scale)  # [B, Hkv, G, D]
    return out.reshape(b, hq, d)


def register() -> None:
    """Makes `paged_attention` available to transformers under `ATTENTION_NAME` (idempotent)."""
    from transformers import AttentionInterface  # deferred: seconds to import, once per runner

    AttentionInterface.register(ATTENTION_NAME, paged_attention)
