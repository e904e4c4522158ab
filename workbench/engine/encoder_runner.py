"""Runs a scheduled step of an embedding model (BERT / MiniLM): prompts in, pooled vectors out.

An encoder attends bidirectionally over its whole input and keeps no KV cache, so a prompt is
always computed in one step (the engine turns chunked prefill off for such a model and gives
each step a budget of at least `max_model_len` tokens). The block manager still runs, as
bookkeeping only: it counts the tokens of the step's sequences and has no tensors behind it
(prefix caching is off: a bidirectional prefix depends on what follows it).

Every scheduled token is packed into one ragged row `[1, T, H]` and goes through transformers'
own embeddings and `BertLayer`s, so the linear layers never see padding. Only attention needs
the sequences apart: `encoder_attention` (registered with transformers' `AttentionInterface`)
scatters the packed Q/K/V into `[B, Hh, Lmax, D]`, runs one SDPA call with a key-padding mask and
gathers the valid rows back. Called without a context it is plain SDPA, so the same model object
still works with a normal transformers forward. In bfloat16 on CPU the linears are prepacked for
oneDNN (`engine/fusion.py`'s `FastLinear`, bit-identical to `F.linear`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workbench.engine.fusion import FastLinear, can_prepack
from workbench.engine.pooling import pool_segments
from workbench.engine.runner import LogitRows
from workbench.engine.scheduler import SchedulerOutput

ENCODER_ATTENTION = "workbench_encoder"


@dataclass
class EncoderContext:
    """Where each packed token sits in the padded attention batch (built once per step)."""

    index: torch.Tensor  # [T] position of each packed token in the flat [B * Lmax] padded batch
    batch: int  # B
    max_len: int  # Lmax
    mask: torch.Tensor | None  # [B, 1, 1, Lmax] bool, True = a real key; None: nothing padded


def encoder_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      wb_enc: EncoderContext | None = None, **kwargs):
    """query/key/value: [1, Hh, T, D] packed -> ([1, T, Hh, D], None); see the module docstring."""
    if wb_enc is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      scaling=scaling, dropout=dropout, **kwargs)
    ctx = wb_enc
    heads, dim = query.shape[1], query.shape[3]

    def padded(x: torch.Tensor) -> torch.Tensor:  # [1, Hh, T, D] -> [B, Hh, Lmax, D]
        if ctx.mask is None:
            return x[0].view(heads, ctx.batch, ctx.max_len, dim).transpose(0, 1)
        out = x.new_zeros(heads, ctx.batch * ctx.max_len, dim)
        out[:, ctx.index] = x[0]
        return out.view(heads, ctx.batch, ctx.max_len, dim).transpose(0, 1)

    out = F.scaled_dot_product_attention(padded(query), padded(key), padded(value),
                                         attn_mask=ctx.mask, scale=scaling)  # [B, Hh, Lmax, D]
    out = out.transpose(1, 2).reshape(ctx.batch * ctx.max_len, heads, dim)
    if ctx.mask is not None:
        out = out.index_select(0, ctx.index)
    return out.unsqueeze(0), None  # [1, T, Hh, D]


def prepack_linears(model: nn.Module) -> int:
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
                    setattr(owner, name, FastLinear(child.weight, child.bias, True))
                    count += 1
    return count


class EncoderRunner:
    """Executes `SchedulerOutput`s on a transformers BERT-like encoder (see the module docstring).

    `execute` returns `LogitRows` whose `hidden` row i is the pooled vector of the i-th scheduled
    sequence (`last_row[id(seq)] == i`) and whose `logits` are empty.
    """

    def __init__(self, model, pooling: str):
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(ENCODER_ATTENTION, encoder_attention)
        AttentionMaskInterface.register(ENCODER_ATTENTION, sdpa_mask)  # plain forwards: SDPA's masks
        model.set_attn_implementation(ENCODER_ATTENTION)
        if next(model.parameters()).dtype != torch.float32:
            prepack_linears(model)  # float32 stays exactly as loaded, for numerical tests
        self.model = model
        self.pooling = pooling
        self.device = next(model.parameters()).device

    def _context(self, lengths: list[int]) -> EncoderContext:
        batch, max_len = len(lengths), max(lengths)
        if min(lengths) == max_len:
            return EncoderContext(torch.arange(0), batch, max_len, None)
        lens = torch.tensor(lengths)
        valid = torch.arange(max_len).unsqueeze(0) < lens.unsqueeze(1)  # [B, Lmax]
        index = valid.flatten().nonzero().squeeze(1)  # [T]
        mask = valid[:, None, None, :]
        return EncoderContext(index.to(self.device), batch, max_len, mask.to(self.device))

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> LogitRows:
        ids: list[int] = []
        positions: list[torch.Tensor] = []
        lengths: list[int] = []
        for s in out.scheduled:  # always whole prompts: no chunking for an encoder
            seq = s.seq
            assert s.num_tokens == len(seq.token_ids) and seq.num_computed_tokens == 0
            ids.extend(seq.token_ids)
            positions.append(torch.arange(s.num_tokens))
            lengths.append(s.num_tokens)
        input_ids = torch.tensor(ids, device=self.device).unsqueeze(0)  # [1, T]
        pos = torch.cat(positions).to(self.device).unsqueeze(0)  # [1, T]
        hidden = self.model.embeddings(input_ids=input_ids, position_ids=pos,
                                       token_type_ids=torch.zeros_like(input_ids))  # [1, T, H]
        ctx = self._context(lengths)
        for layer in self.model.encoder.layer:
            hidden = layer(hidden, attention_mask=None, wb_enc=ctx)
        pooled = pool_segments(hidden[0], lengths, self.pooling)  # [B, H]
        last_row = {id(s.seq): i for i, s in enumerate(out.scheduled)}
        empty = torch.empty(len(lengths), 0)
        return LogitRows(empty, last_row, {}, pooled)
