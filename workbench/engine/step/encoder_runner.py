"""Runs a scheduled step of an embedding model (BERT / MiniLM): prompts in, pooled vectors out.

An encoder attends bidirectionally over its whole input and keeps no KV cache, so a prompt is
always computed in one step (the engine turns chunked prefill off for such a model and gives
each step a budget of at least `max_model_len` tokens). The block manager still runs, as
bookkeeping only: it counts the tokens of the step's sequences and has no tensors behind it
(prefix caching is off: a bidirectional prefix depends on what follows it).

The step's prompts are packed, sorted by length, into one ragged row `[1, T, H]` that goes
through transformers' own embeddings and `BertLayer`s, so the linear layers never see padding.
Only attention needs the sequences apart: `encoder_attention` (registered with transformers'
`AttentionInterface`) runs one unmasked SDPA call per run of equal lengths, on a view of the
packed Q/K/V: the attention of each sentence alone, no padding anywhere (faster than one padded,
key-masked SDPA call over the step: docs/benchmark.md). Called without a context it is plain SDPA (with SDPA's masks), so the same model object
still works in a normal transformers forward. In bfloat16 on CPU the linears are prepacked for
oneDNN (`engine/step/fusion.py`'s `FastLinear`, bit-identical to `F.linear`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.engine.requests.scheduler import SchedulerOutput
from workbench.engine.step.fusion import FastLinear, can_prepack
from workbench.engine.step.pooling import pool_segments
from workbench.engine.step.runner import LogitRows
from workbench.errors import ValidationError

ENCODER_ATTENTION = "workbench_encoder"
# BERT's layout (embeddings with position and token type ids, `encoder.layer` of self-attention
# layers calling the attention interface); RoBERTa's positions start after its padding id
SUPPORTED_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "electra"})


@dataclass
class EncoderContext:
    """Where the sequences sit in the packed row (built once per step): packed by length, so
    the sequences of one length are one contiguous `[count * length]` run."""

    runs: list[tuple[int, int, int]]  # (first packed token, count, length) of each run


def encoder_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      wb_enc: EncoderContext | None = None, **kwargs):
    """query/key/value: [1, Hh, T, D] packed -> ([1, T, Hh, D], None); see the module docstring."""
    if wb_enc is None:
        # deferred: transformers takes seconds to import, and only a forward without our
        # context (plain transformers use of the model) needs this
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, dropout=dropout, **kwargs)
    heads, dim = query.shape[1], query.shape[3]
    out = query.new_empty(query.shape[2], heads, dim)  # [T, Hh, D]
    for start, count, length in wb_enc.runs:
        span = slice(start, start + count * length)
        q, k, v = (x[0, :, span].view(heads, count, length, dim).transpose(0, 1)  # views:
                   for x in (query, key, value))  # [1, Hh, T, D] -> [count, Hh, L, D]
        o = F.scaled_dot_product_attention(q, k, v, scale=scaling)
        out[span] = o.transpose(1, 2).reshape(count * length, heads, dim)
    return out.unsqueeze(0), None  # [1, T, Hh, D]


def position_offset(model) -> int:
    """The first position id: 0 for BERT, padding_idx + 1 for RoBERTa-style embeddings."""
    padding_idx = getattr(model.embeddings, "padding_idx", None)
    return 0 if padding_idx is None else padding_idx + 1


def max_positions(model) -> int:
    """The longest input the position table takes."""
    return model.config.max_position_embeddings - position_offset(model)


def prepack_linears(model: Any) -> int:
    """Every `nn.Linear` of the encoder layers prepacked for oneDNN (bf16 on CPU only)."""
    layers = model.encoder.layer
    if not can_prepack(next(model.parameters())):
        return 0
    count = 0
    for layer in layers:
        for owner in (layer.attention.self, layer.attention.output, layer.intermediate,
                      layer.output):
            for name, child in list(owner.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(owner, name, FastLinear(child.weight, child.bias, "onednn"))
                    count += 1
    return count


class EncoderRunner:
    """Executes `SchedulerOutput`s on a transformers BERT-like encoder (see the module docstring).

    `execute` returns `LogitRows` whose `hidden` row `last_row[seq.seq_id]` is the pooled vector of
    each scheduled sequence and whose `logits` are empty (`[B, 0]`).
    """

    def __init__(self, model, pooling: str):
        model_type = getattr(model.config, "model_type", None)
        if model_type not in SUPPORTED_TYPES:
            raise ValidationError(
                f"Embedding models of type {model_type!r} are not supported; the encoder runner "
                f"runs {sorted(SUPPORTED_TYPES)}.", parameter="model", value=model_type)
        # deferred: transformers takes seconds to import; needed once, when a runner starts
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(ENCODER_ATTENTION, encoder_attention)
        AttentionMaskInterface.register(ENCODER_ATTENTION, sdpa_mask)  # plain forwards: SDPA's masks
        model.set_attn_implementation(ENCODER_ATTENTION)
        if next(model.parameters()).dtype != torch.float32:
            prepack_linears(model)  # float32 stays exactly as loaded, for numerical tests
        self.model = model
        self.pooling = pooling
        self.position_offset = position_offset(model)
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> LogitRows:
        for s in out.scheduled:  # always whole prompts: no chunking for an encoder
            assert s.num_tokens == len(s.seq.token_ids) and s.seq.num_computed_tokens == 0
        ordered = sorted(out.scheduled, key=lambda s: s.num_tokens)  # runs of equal lengths
        lengths = [s.num_tokens for s in ordered]
        ids = [t for s in ordered for t in s.seq.token_ids]
        input_ids = torch.tensor(ids, device=self.device).unsqueeze(0)  # [1, T]
        pos = torch.cat([torch.arange(n) for n in lengths]).to(self.device).unsqueeze(0)  # [1, T]
        if self.position_offset:
            pos = pos + self.position_offset
        hidden = self.model.embeddings(input_ids=input_ids, position_ids=pos,
                                       token_type_ids=torch.zeros_like(input_ids))  # [1, T, E]
        project = getattr(self.model, "embeddings_project", None)  # ELECTRA's E -> H, if E != H
        if project is not None:
            hidden = project(hidden)  # [1, T, H]
        ctx = EncoderContext(_runs(lengths))
        for layer in self.model.encoder.layer:
            hidden = layer(hidden, attention_mask=None, wb_enc=ctx)
        pooled = pool_segments(hidden[0], lengths, self.pooling)  # [B, H]
        last_row = {s.seq.seq_id: i for i, s in enumerate(ordered)}
        empty = torch.empty(len(lengths), 0)
        return LogitRows(empty, last_row, {}, pooled)


def _runs(lengths: list[int]) -> list[tuple[int, int, int]]:
    """(first token, count, length) of each run of equal lengths in a sorted packing."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for length, group in itertools.groupby(lengths):
        count = len(list(group))
        runs.append((start, count, length))
        start += count * length
    return runs
