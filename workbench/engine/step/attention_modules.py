"""Stand-ins for the forward of attention modules that compute attention themselves.

Most families call transformers' attention interface, where `attention.paged_attention` takes
the place of SDPA. BLOOM's and Falcon's attention modules do the whole computation in their own
forward (ALiBi biases, Falcon's multi-query and grouped fused heads), so the engine gives each
such module a forward of its own: the module's arithmetic up to the attention (its fused
projection, its own head split, Falcon's rotary embedding with its own function), then
`attention.attend` over the paged cache (ALiBi as a bias per head and key position, the same
`slope * position` BLOOM's `build_alibi_tensor` computes), then the module's output projection
(and BLOOM's residual add). Without a step's context (transformers' own `generate` on the same
object) the module's own forward runs. `install(model, family, layers)` sets them per module.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from workbench.engine.step.attention import Alibi, attend, current_context


def _family_module(attn) -> Any:
    """The modeling module of `attn`'s class (its helper functions: rotary, ALiBi slopes)."""
    return sys.modules[type(attn).__module__]


def _slopes(attn, heads: int, device) -> torch.Tensor:
    """The family's own ALiBi slopes [heads] (float32): its `build_alibi_tensor` at position 1."""
    build = _family_module(attn).build_alibi_tensor
    ones = torch.ones(1, 2, dtype=torch.long, device=device)
    return build(ones, heads, torch.float32).view(heads, 2)[:, 1]


def bloom_forward(self, hidden_states, residual, alibi, attention_mask, layer_past=None,
                  use_cache=False, output_attentions=False, **kwargs):
    """`BloomAttention.forward` over the paged cache (see the module docstring)."""
    ctx = current_context()
    if ctx is None:
        return type(self).forward(self, hidden_states, residual, alibi, attention_mask,
                                  layer_past=layer_past, use_cache=use_cache,
                                  output_attentions=output_attentions, **kwargs)
    t = hidden_states.shape[1]
    q, k, v = self._reshape(self.query_key_value(hidden_states))  # [1, H, T, D] each
    out = attend(ctx, self.layer_idx, q[0].transpose(0, 1), k[0].transpose(0, 1),
                 v[0].transpose(0, 1), self.inv_norm_factor,
                 alibi=Alibi(self._wb_slopes, 1.0))  # [T, H, D]
    output = self.dense(out.reshape(1, t, self.num_heads * self.head_dim))
    return _family_module(self).dropout_add(output, residual, self.hidden_dropout,
                                            self.training), None


def falcon_forward(self, hidden_states, *args, position_embeddings=None, **kwargs):
    """`FalconAttention.forward` over the paged cache (see the module docstring): grouped
    heads (the new decoder architecture) keep one key / value per group, as GQA, instead of
    the copies transformers broadcasts to every query head. Its other arguments (the mask;
    before transformers 5.25 an `alibi` tensor too) are transformers' own forward's."""
    ctx = current_context()
    if ctx is None:
        return type(self).forward(self, hidden_states, *args,
                                  position_embeddings=position_embeddings, **kwargs)
    t, d = hidden_states.shape[1], self.head_dim
    fused = self.query_key_value(hidden_states)
    if self.new_decoder_architecture:
        qkv = fused.view(t, self.num_kv_heads, self.num_heads // self.num_kv_heads + 2, d)
        q, k, v = qkv[:, :, :-2].flatten(1, 2), qkv[:, :, -2], qkv[:, :, -1]  # [T, H|G, D]
    elif self.multi_query:  # the heads' queries, then one key and one value
        qkv = fused.view(t, self.num_heads + 2, d)
        q, k, v = qkv[:, :-2], qkv[:, -2:-1], qkv[:, -1:]  # [T, H, D], [T, 1, D], [T, 1, D]
    else:  # query, key and value interleaved per head
        q, k, v = fused.view(t, self.num_heads, 3, d).unbind(2)  # [T, H, D] each
    if self._wb_slopes is None:  # rotary, with the family's own function on [1, heads, T, D]
        cos, sin = position_embeddings
        q4, k4 = _family_module(self).apply_rotary_pos_emb(
            q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), cos, sin)
        q, k = q4[0].transpose(0, 1), k4[0].transpose(0, 1)
        out = attend(ctx, self.layer_idx, q, k, v, self.inv_norm_factor)
    else:  # transformers adds alibi / sqrt(head_dim) to the scaled scores
        out = attend(ctx, self.layer_idx, q, k, v, self.inv_norm_factor,
                     alibi=Alibi(self._wb_slopes, 1 / math.sqrt(d)))
    return self.dense(out.reshape(1, t, self.num_heads * d)), None


# family -> (the layer's attribute holding its attention module, the engine's forward for it)
FORWARDS: dict[str, tuple[str, Callable[..., Any]]] = {
    "bloom": ("self_attention", bloom_forward), "falcon": ("self_attention", falcon_forward)}


def install(family: str, layers, config, base=None) -> None:
    """Gives each layer's attention module the engine's forward for `family`; for an ALiBi
    Falcon, `base` (its `FalconModel`) builds no ALiBi of its own during the engine's steps
    (`_own_alibi_off_in_steps`)."""
    name, forward = FORWARDS[family]
    if family == "falcon" and getattr(config, "alibi", False) and base is not None:
        _own_alibi_off_in_steps(base)
    for layer in layers:
        attn = getattr(layer, name)
        alibi = family == "bloom" or getattr(config, "alibi", False)
        weight = attn.query_key_value.weight if hasattr(attn.query_key_value, "weight") else None
        device = weight.device if weight is not None else torch.device("cpu")
        attn._wb_slopes = _slopes(attn, attn.num_heads, device) if alibi else None
        attn.forward = types.MethodType(forward, attn)


def _own_alibi_off_in_steps(base) -> None:
    """The engine's forward adds the family's slopes itself (`falcon_forward`); transformers'
    `FalconModel` (5.25 and later) folds its ALiBi into the causal mask, which it builds through
    the attention implementation's mask function, and the engine's implementation takes no
    mask. So while a step's context is current, `use_alibi` is off (earlier versions passed the
    tensor to the layers, which ignore it then); a forward without a context (`generate` on the
    same model) is transformers' own."""
    def off(module, args, kwargs):
        if current_context() is not None and module.use_alibi:
            module.use_alibi = False
            module._wb_alibi_was_on = True

    def back(module, args, kwargs, output):
        if getattr(module, "_wb_alibi_was_on", False):
            module.use_alibi, module._wb_alibi_was_on = True, False

    base.register_forward_pre_hook(off, with_kwargs=True)
    base.register_forward_hook(back, with_kwargs=True, always_call=True)
