"""Opt-in (`WORKBENCH_COMPILE=1`): a lone stream's decode steps through one compiled graph.

Eager, a third of such a step is dispatch of the few hundred small operators between the
projections. `CompiledDecode` runs the layers for one token as one `torch.compile` graph on
inductor's CPU backend (as vLLM's CPU worker does): weights frozen (inductor's own oneDNN-packed
copy; with the `avx512bf16` kernel the products call its C function instead, as an operator of
their own, on the plain weights), a C++ wrapper, norms, rotary, residuals and activation fused.
Attention stays paged: K/V written into the cache, the context gathered through its slots,
padded to a power-of-two bucket and masked; each bucket compiles once, in tens of seconds. Not
bit-identical to the eager loop, which stays the reference and the default and takes every
other step (batches, prefills, LoRA).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from workbench.engine import gemv
from workbench.engine.attention import AttentionContext
from workbench.engine.decoder import DecoderStack, _rms_norm, _rotate, _signed_sin

ENV = "WORKBENCH_COMPILE"
MIN_BUCKET = 128


def compile_enabled() -> bool:
    """Whether `$WORKBENCH_COMPILE` asks for compiled decode steps."""
    return os.environ.get(ENV, "") not in ("", "0")


def bucket(length: int) -> int:
    """The padded context length a graph is compiled for: a power of two, at least MIN_BUCKET."""
    return max(MIN_BUCKET, 1 << (length - 1).bit_length())


def _projections(stack: DecoderStack):
    """Each layer's fused Q/K/V, O, fused gate/up and down `FastLinear`s, in that order."""
    for layer in stack.layers:
        attn, mlp = layer.self_attn, layer.mlp
        yield from (attn.q_proj.group.linear, attn.o_proj, mlp.gate_proj.group.linear,
                    mlp.down_proj)


class _DecodeGraph(torch.nn.Module):
    """The stack's layers for one token [1, H], as a module (its projection weights are its
    parameters, sharing the runner's tensors)."""

    def __init__(self, stack: DecoderStack, weights: list[torch.Tensor], c_kernel: bool):
        super().__init__()
        self.stack = stack
        self.linear = gemv.linear_bf16_op if c_kernel else F.linear
        for i, weight in enumerate(weights):  # parameters: what freezing prepacks
            self.register_parameter(f"w{i}", torch.nn.Parameter(weight, requires_grad=False))

    def forward(self, hidden, cos, sin, slot, ctx_slots, mask, kv_caches):
        stack = self.stack
        hq, hkv, d = stack.num_heads, stack.num_kv_heads, stack.head_dim
        cos, sin = cos.unsqueeze(1), _signed_sin(sin).unsqueeze(1)  # [1, 1, D]
        for i, ((w1, eps1), _, _, (w2, eps2), _, _, act, scaling, _) in enumerate(stack.plan):
            wqkv, wo, wgu, wd = (getattr(self, f"w{4 * i + j}") for j in range(4))
            qkv = self.linear(_rms_norm(hidden, w1, eps1), wqkv)
            qk = _rotate(qkv[:, :(hq + hkv) * d].view(1, hq + hkv, d), cos, sin)
            v = qkv[:, (hq + hkv) * d:].view(1, hkv, d)
            k_cache, v_cache = kv_caches[i]
            k_cache.index_copy_(0, slot, qk[:, hq:])
            v_cache.index_copy_(0, slot, v)
            kd = k_cache.index_select(0, ctx_slots).view(1, -1, hkv, d).transpose(1, 2)
            vd = v_cache.index_select(0, ctx_slots).view(1, -1, hkv, d).transpose(1, 2)
            q = qk[:, :hq].reshape(1, hkv, hq // hkv, d)  # as attention.decode_attention
            out = F.scaled_dot_product_attention(q, kd, vd, attn_mask=mask, scale=scaling)
            hidden = hidden + self.linear(out.reshape(1, hq * d), wo)
            gate, up = self.linear(_rms_norm(hidden, w2, eps2), wgu).chunk(2, dim=-1)
            hidden = hidden + self.linear(act(gate) * up, wd)
        return hidden


class CompiledDecode:
    """Compiled single-stream decode steps over a runner's stack and KV cache."""

    def __init__(self, stack: DecoderStack, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]):
        projections = list(_projections(stack))
        weights = [linear.weight for linear in projections]  # plain [out, in], no bias
        c_kernel = all(linear.kernel == "avx512bf16" for linear in projections)
        self.kv_caches = kv_caches
        self.graph = torch.compile(_DecodeGraph(stack, weights, c_kernel), dynamic=False)
        # inductor's settings for the graph, set around each call: compilation (each new
        # bucket's) reads them then (as torch.compile's options= torch 2.13 drops freezing)
        from torch._inductor import config  # deferred: inductor loads only when opted in

        self._settings = lambda: config.patch(freezing=True, cpp_wrapper=True)

    @staticmethod
    def supports(stack: DecoderStack) -> bool:
        """Whether every projection keeps a plain weight (not the `onednn` kernel) and has no
        bias (not Qwen2's Q/K/V), and no layer has a sliding window (the graph reads whole
        contexts)."""
        return all(getattr(linear, "weight", None) is not None and linear.bias is None
                   for linear in _projections(stack)) and all(w is None for w in stack.windows)

    @staticmethod
    def takes(ctx: AttentionContext, tokens: int) -> bool:
        """Whether this step is one decode token and nothing else."""
        return tokens == 1 and ctx.num_decode == 1

    def __call__(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 ctx: AttentionContext) -> torch.Tensor:
        """hidden: [1, H]; cos, sin: [1, D] -> [1, H], as `DecoderStack.__call__`."""
        slots = ctx.decode_flat_slots  # [L]
        assert slots is not None  # a decode step's context has its slots (`takes`)
        length = slots.shape[0]
        size = bucket(length)
        ctx_slots = slots.new_full((size,), int(slots[0]))  # padding reads a real slot, masked below
        ctx_slots[:length] = slots
        mask = (torch.arange(size) < length).view(1, 1, 1, size)
        with self._settings():
            return self.graph(hidden, cos, sin, ctx.slot_mapping, ctx_slots, mask,
                              self.kv_caches)
