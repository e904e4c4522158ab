"""Paged attention for transformers' own decoder layers, over our block-table KV cache.

`paged_attention` is registered with transformers' `AttentionInterface`, so a stock
`LlamaDecoderLayer` (or Qwen2, Mistral) calls it in place of SDPA. Every step packs all scheduled
tokens of all sequences into one ragged row (`[1, T, hidden]`, no padding in the linear layers);
the step's `AttentionContext`, built once and made current for the forward (`forward_context`,
as vLLM's: a layer need not pass its keyword arguments down, StableLM's does not), says where
each token's K/V goes (`slot_mapping`) and which cached slots each query reads.

With a batch-invariant engine (`LLM(batch_invariant=True)`) every query token, a prefill's
or a decode's, is attended alone against its own context in C in one fixed order
(`c_attention.paged_attention`): its output is the same bits whatever shares the step, however its
prompt was chunked, with or without a prefix-cache hit. Otherwise:
decode tokens (one query per sequence) are attended together: in C, reading each context in
place through its slots (`c_attention.decode_attention`, where the kernel choice's ops are "c";
`c_attention.paged_attention` where a window, soft-capping or ALiBi applies, 17x torch's
gathered eager attention for 16 of Gemma 2's decodes of 32 tokens), else in
one SDPA call over their gathered contexts, padded to the longest (a lone decode whose blocks
are consecutive reads its context as a view of the cache instead). Each prefill chunk gets its
own causal SDPA call. Called without a context, it is plain SDPA, so the same model object still
works with `generate`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from workbench.engine.kernels import c_attention

if TYPE_CHECKING:
    from workbench.engine.step.inspection import StepInspector

ATTENTION_NAME = "workbench_paged"


@dataclass
class PrefillChunk:
    start: int  # first of its query tokens in the packed row
    num_tokens: int  # query tokens this step
    slots: torch.Tensor  # [L] cache slots of its whole context (cached prefix + this chunk)
    mask: torch.Tensor | None  # [num_tokens, L] bool, None when plainly causal (no prefix)


@dataclass(frozen=True)
class QueryContexts:
    """Where each query token's context lies, for the batch-invariant engine's attention
    (`c_attention.paged_attention`): token t (packed order) sits at position lengths[t] - 1 of its
    sequence, whose context's cache slots are slots[offsets[t]:offsets[t] + lengths[t]] (a
    sequence's tokens share one run of slots)."""

    slots: torch.Tensor  # [N] int64: each scheduled sequence's context slots, one after another
    offsets: torch.Tensor  # [T] int64
    lengths: torch.Tensor  # [T] int64
    max_length: int


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
    max_decode_length: int = 0  # the longest of them (a window shorter than it needs a mask)
    c_attention: bool = False  # decodes through c_attention.decode_attention (`KernelChoice.ops`)
    decode_flat_slots: torch.Tensor | None = field(init=False)  # [B * Lmax], gathered per layer
    probe: dict[int, LayerAttention] | None = None  # filled by each layer's call when given
    # a step that records or intervenes for some request (`engine/step/inspection.py`): patterns
    inspector: StepInspector | None = None
    # the batch-invariant engine's: every query token attended alone, in C (`attend`)
    queries: QueryContexts | None = None

    longest_context: int = field(init=False)  # the longest prefill chunk's context

    def __post_init__(self):
        self.decode_flat_slots = None if self.decode_slots is None else \
            self.decode_slots.flatten()
        self.longest_context = max((c.slots.shape[0] for c in self.prefills), default=0)

    @functools.cached_property
    def decode_offsets(self) -> torch.Tensor:
        """[B] int64: where each decode's context starts in `decode_flat_slots` (b * Lmax),
        as `c_attention.paged_attention` takes it; once a step, for every layer."""
        assert self.decode_slots is not None
        b, lmax = self.decode_slots.shape
        return torch.arange(0, b * lmax, lmax, device=self.decode_slots.device)


# what transformers' layers pass beside the tensors that the paged attention has no use for:
# positions (the rotary embedding is applied already), the cache (ours is the context's)
_UNUSED_KWARGS = frozenset({"position_ids", "cache_position", "position_embeddings", "cache",
                            "past_key_values", "layer_past", "use_cache", "is_causal"})


_current = threading.local()


def current_context() -> AttentionContext | None:
    """The step's context on this thread, None outside the engine's forward."""
    return getattr(_current, "ctx", None)


@contextmanager
def forward_context(ctx: AttentionContext) -> Iterator[None]:
    """Makes `ctx` the paged attention's context for a forward on this thread."""
    previous = getattr(_current, "ctx", None)
    _current.ctx = ctx
    try:
        yield
    finally:
        _current.ctx = previous


def paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                    sliding_window: int | None = None, softcap: float | None = None, **kwargs):
    """query: [1, Hq, T, D]; key/value: [1, Hkv, T, D] -> ([1, T, Hq, D], None).

    Without a context (the model called by `generate` or a plain forward) it is transformers'
    SDPA (or, with a softcap, its eager attention, which SDPA cannot do).
    """
    wb_ctx = current_context()
    if wb_ctx is None:
        # deferred: transformers takes seconds to import, and only a forward without our
        # context (plain transformers use of the model) needs this
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        if softcap is not None:
            return _transformers_eager(module)(module, query, key, value, attention_mask,
                                               scaling=scaling, dropout=dropout,
                                               softcap=softcap, **kwargs)
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, dropout=dropout, **kwargs)
    unknown = set(kwargs) - _UNUSED_KWARGS
    if unknown or attention_mask is not None:
        raise NotImplementedError(
            f"{type(module).__name__} passes {sorted(unknown) or ['an attention mask']} to its "
            "attention, which the paged attention does not implement")
    out = attend(wb_ctx, module.layer_idx, query[0].transpose(0, 1), key[0].transpose(0, 1),
                 value[0].transpose(0, 1), scaling, sliding_window, softcap)
    return out.unsqueeze(0), None


def _transformers_eager(module):
    """The eager attention function of the module's own modeling file (Gemma 2's, with
    soft-capping)."""
    import sys  # deferred with the modeling module it reads

    return sys.modules[type(module).__module__].eager_attention_forward


@dataclass(frozen=True)
class Alibi:
    """ALiBi: each score of head h at key position j gets `(slopes[h] * j) * scale` added,
    the bias rounded to the scores' dtype first (BLOOM's and Falcon's `build_alibi_tensor`)."""

    slopes: torch.Tensor  # [Hq] float32
    scale: float

    def bias(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[Hq, L] for key positions [L]."""
        bias = (self.slopes[:, None] * positions[None, :].float()).to(dtype)
        return bias if self.scale == 1.0 else bias * self.scale


@dataclass(frozen=True)
class LayerAttention:
    """What one layer's attention asked for in the runner's probe step."""

    scaling: float | None
    sliding_window: int | None
    softcap: float | None
    kv_shape: tuple[int, ...]  # (KV heads, head size) of its keys


def attend(ctx: AttentionContext, layer_idx: int, q: torch.Tensor, k: torch.Tensor | None,
           v: torch.Tensor | None, scaling: float | None, window: int | None = None,
           softcap: float | None = None, alibi: Alibi | None = None) -> torch.Tensor:
    """Writes the step's K/V into layer `layer_idx`'s cache (unless k and v are None: already
    written), then attends every query to its context (its last `window` positions, scores
    soft-capped at `softcap`: the module docstring). q: [T, Hq, D]; k, v: [T, Hkv, D] ->
    [T, Hq, D]; `alibi` adds BLOOM's / Falcon's position biases."""
    if ctx.probe is not None:  # the runner's probe step: what each layer asks for
        assert k is not None
        ctx.probe[layer_idx] = LayerAttention(scaling, window, softcap, tuple(k.shape[1:]))
        if ctx.kv_caches[layer_idx][0].shape[1:] != k.shape[1:]:  # scratch, as its keys are
            scratch = k.new_zeros(ctx.kv_caches[layer_idx][0].shape[0], *k.shape[1:])
            ctx.kv_caches[layer_idx] = (scratch, scratch.clone())
    k_cache, v_cache = ctx.kv_caches[layer_idx]
    if k is not None and v is not None:  # written first, so that the reads below see them
        k_cache.index_copy_(0, ctx.slot_mapping, k)
        v_cache.index_copy_(0, ctx.slot_mapping, v)
    if ctx.inspector is not None:
        ctx.inspector.pattern(layer_idx, q, k_cache, scaling, window, softcap,
                              None if alibi is None else (lambda pos: alibi.bias(pos, q.dtype)))
    if ctx.queries is not None:
        return _attend_alone(ctx.queries, q, k_cache, v_cache, scaling, window, softcap, alibi)
    nd = ctx.num_decode
    if window is not None and window >= max(ctx.max_decode_length, ctx.longest_context):
        window = None  # no context reaches past it this step
    if nd == q.shape[0]:  # decodes only (every step of plain generation): no output to splice
        return _attend_decodes(ctx, q, k_cache, v_cache, scaling, window, softcap, alibi)
    out = torch.empty_like(q)  # [T, Hq, D]
    if nd:
        out[:nd] = _attend_decodes(ctx, q[:nd], k_cache, v_cache, scaling, window, softcap,
                                   alibi)
    for chunk in ctx.prefills:
        s, n = chunk.start, chunk.num_tokens
        out[s:s + n] = _attend_chunk(chunk, q[s:s + n], k_cache, v_cache, scaling, window,
                                     softcap, alibi)
    return out


def _attend_alone(queries: QueryContexts, q: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, scaling: float | None, window: int | None,
                  softcap: float | None, alibi: Alibi | None) -> torch.Tensor:
    """Each query token against its own context, in one fixed order per token whatever else
    the step holds (`c_attention.paged_attention`): the batch-invariant engine's attention, for
    prefill chunks and decodes alike. The runner checked at start-up that the C function
    takes this model's shapes."""
    out = c_attention.paged_attention(q, k_cache, v_cache, queries.slots, queries.offsets,
                               queries.lengths, queries.max_length,
                               scaling or q.shape[-1] ** -0.5, window, softcap,
                               None if alibi is None else alibi.slopes,
                               1.0 if alibi is None else alibi.scale)
    if out is None:
        raise RuntimeError("the batch-invariant attention (c_attention.paged_attention) does not take "
                           f"queries of shape {tuple(q.shape)} in {q.dtype}")
    return out


def _attend_chunk(chunk: PrefillChunk, q: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, scaling: float | None, window: int | None,
                  softcap: float | None, alibi: Alibi | None) -> torch.Tensor:
    """One prefill chunk's queries q [n, Hq, D] against its context (causal; within `window`;
    soft-capped; with ALiBi biases) -> [n, Hq, D]."""
    n = chunk.num_tokens
    slots, mask, first = chunk.slots, chunk.mask, 0
    if window is not None:  # keys from the first query's window on, each query its own
        length = slots.shape[0]
        first = max(0, length - n - window + 1)
        q_pos = torch.arange(length - n, length, device=q.device).unsqueeze(1)
        k_pos = torch.arange(first, length, device=q.device).unsqueeze(0)
        mask = (k_pos <= q_pos) & (k_pos > q_pos - window)  # [n, L - first]
        slots = slots[first:]
    kp = k_cache.index_select(0, slots).transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
    vp = v_cache.index_select(0, slots).transpose(0, 1).unsqueeze(0)
    qp = q.transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
    if mask is None and (softcap is not None or alibi is not None):
        length = slots.shape[0]  # plainly causal: query i at position L - n + i
        mask = torch.ones(n, length, dtype=torch.bool, device=q.device).tril(length - n)
    if alibi is not None and mask is not None:  # a float mask: biases, -inf where masked
        bias = alibi.bias(torch.arange(first, first + slots.shape[0], device=q.device),
                          q.dtype)  # [Hq, L]
        float_mask = bias[:, None, :].masked_fill(~mask, float("-inf")).unsqueeze(0)
        o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=float_mask, scale=scaling,
                                           enable_gqa=True)
    elif softcap is not None and mask is not None:
        o = eager_attention(qp, kp, vp, mask, scaling or q.shape[-1] ** -0.5, softcap)
    else:
        o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=scaling,
                                           is_causal=mask is None, enable_gqa=True)
    return o[0].transpose(0, 1)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                    scale: float, softcap: float) -> torch.Tensor:
    """transformers' eager attention with soft-capped scores, in its ops and dtypes.

    q: [B, Hq, n, D]; k, v: [B, Hkv, L, D]; mask: bool, broadcast to [B, Hq, n, L] -> [B, Hq, n, D].
    """
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)  # transformers' repeat_kv
    v = v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


def _attend_decodes(ctx: AttentionContext, qd: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, scaling: float | None, window: int | None = None,
                    softcap: float | None = None, alibi: Alibi | None = None) -> torch.Tensor:
    """The decode queries qd [B, Hq, D] against their gathered contexts -> [B, Hq, D]."""
    assert ctx.decode_slots is not None and ctx.decode_flat_slots is not None  # decodes run
    scale = scaling or qd.shape[-1] ** -0.5
    if window is not None or softcap is not None or alibi is not None:
        if ctx.c_attention and ctx.decode_lengths is not None:  # each decode in C, in place
            out = c_attention.paged_attention(
                qd, k_cache, v_cache, ctx.decode_flat_slots, ctx.decode_offsets,
                ctx.decode_lengths, ctx.decode_slots.shape[1], scale, window, softcap,
                None if alibi is None else alibi.slopes, 1.0 if alibi is None else alibi.scale)
            if out is not None:
                return out
        return _attend_decodes_masked(ctx, qd, k_cache, v_cache, scale, window, softcap, alibi)
    if ctx.c_attention and ctx.decode_lengths is not None:
        out = c_attention.decode_attention(qd, k_cache, v_cache, ctx.decode_slots, ctx.decode_lengths,
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


def _attend_decodes_masked(ctx: AttentionContext, qd: torch.Tensor, k_cache: torch.Tensor,
                           v_cache: torch.Tensor, scale: float, window: int | None,
                           softcap: float | None, alibi: Alibi | None = None) -> torch.Tensor:
    """Decodes whose keys are limited to a window, whose scores are soft-capped or carry
    ALiBi biases: the gathered contexts with each one's mask."""
    assert ctx.decode_flat_slots is not None and ctx.decode_lengths is not None
    assert ctx.decode_slots is not None
    b, lmax = ctx.decode_slots.shape
    shape = (b, lmax, *k_cache.shape[1:])  # [B, Lmax, Hkv, D]
    kd = k_cache.index_select(0, ctx.decode_flat_slots).view(shape)
    vd = v_cache.index_select(0, ctx.decode_flat_slots).view(shape)
    positions = torch.arange(lmax, device=qd.device).unsqueeze(0)  # [1, Lmax]
    lengths = ctx.decode_lengths.unsqueeze(1)  # [B, 1]
    mask = positions < lengths
    if window is not None:  # the query sits at length - 1
        mask = mask & (positions > lengths - 1 - window)
    if alibi is not None:  # [B, Hq, 1, Lmax] biases, -inf where masked
        bias = alibi.bias(positions[0], qd.dtype)[None, :, None, :]
        float_mask = bias.masked_fill(~mask[:, None, None, :], float("-inf"))
        out = F.scaled_dot_product_attention(qd.unsqueeze(2), kd.transpose(1, 2),
                                             vd.transpose(1, 2), attn_mask=float_mask,
                                             scale=scale, enable_gqa=True)
        return out[:, :, 0]
    if softcap is None:
        return decode_attention(qd, kd, vd, mask, scale)
    out = eager_attention(qd.unsqueeze(2), kd.transpose(1, 2), vd.transpose(1, 2),
                          mask[:, None, None, :], scale, softcap)  # [B, Hq, 1, D]
    return out[:, :, 0]


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
