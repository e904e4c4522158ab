"""The decoder stack of a Llama-family model in one lean loop: same modules, a third of the ops.

transformers' decoder layer spends more time around its arithmetic than in it for a small model
decoding one token: views and transposes to `[1, heads, T, head_dim]` and back, keyword plumbing
and decorators per call, rotary embeddings applied to queries and keys apart. `DecoderStack`
runs the same computation on the packed `[T, hidden]` row with the layer's own modules (its
RMSNorms, fused projections, activation) and `attention.attend`, in the same order and the same
dtypes, so the result is bit-identical to calling the layers (`tests/engine/test_decoder.py`),
with about a third of the operator calls per layer.

It is used in every dtype once `engine/fusion.py` has fused Q/K/V and gate/up, for the families
whose layers are exactly pre-norm attention + gated MLP (`FAMILIES`); anything else (other
families, a layer it does not recognise) goes through transformers' layers.
Projections are looked up per call, so LoRA wrappers (`workbench/lora/layers.py`) apply.
"""

from __future__ import annotations

import torch

from workbench.engine.attention import AttentionContext, attend
from workbench.engine.fusion import FusedPart

FAMILIES = frozenset({"llama", "mistral", "qwen2"})


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' `apply_rotary_pos_emb` on `[T, heads, D]` with `cos`/`sin` `[T, 1, D]`."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class DecoderStack:
    """Runs `model.model.layers` on a packed row (see the module docstring)."""

    def __init__(self, model):
        self.layers = list(model.model.layers)
        cfg = model.config
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    @staticmethod
    def supports(model) -> bool:
        """Whether every layer is the plain pre-norm layer with fused projections."""
        if model.config.model_type not in FAMILIES:
            return False
        for layer in model.model.layers:
            attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            if not (isinstance(getattr(attn, "q_proj", None), FusedPart)
                    and isinstance(getattr(mlp, "gate_proj", None), FusedPart)
                    and hasattr(mlp, "act_fn") and hasattr(layer, "post_attention_layernorm")):
                return False
        return True

    def __call__(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 ctx: AttentionContext) -> torch.Tensor:
        """hidden: [T, H]; cos, sin: [T, D] -> [T, H] after the last layer (before the norm)."""
        t = hidden.shape[0]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [T, 1, D]
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            qkv = attn.q_proj.group.linear(layer.input_layernorm(hidden))  # [T, (Hq + 2Hkv) D]
            qk = _rotate(qkv[:, :(hq + hkv) * d].view(t, hq + hkv, d), cos, sin)
            v = qkv[:, (hq + hkv) * d:].view(t, hkv, d)
            out = attend(ctx, i, qk[:, :hq], qk[:, hq:], v, attn.scaling)  # [T, Hq, D]
            hidden = hidden + attn.o_proj(out.reshape(t, hq * d))
            gate_up = mlp.gate_proj.group.linear(layer.post_attention_layernorm(hidden))
            gate, up = gate_up.split(mlp.gate_proj.group.sizes, dim=-1)
            hidden = hidden + mlp.down_proj(mlp.act_fn(gate) * up)
        return hidden
