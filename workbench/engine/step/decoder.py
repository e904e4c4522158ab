"""The decoder stack of a Llama-family model in one lean loop: same modules, a third of the ops.

transformers' decoder layer spends more time around its arithmetic than in it for a small model
decoding one token: views and transposes to `[1, heads, T, head_dim]` and back, keyword plumbing
and decorators per call, rotary embeddings applied to queries and keys apart. `DecoderStack`
runs the same computation on the packed `[T, hidden]` row with the layer's own modules (its
RMSNorms, fused projections, activation) and `attention.attend`, in the same order and the same
dtypes, so the result is bit-identical to calling the layers (`tests/engine/step/test_decoder.py`),
with about a third of the operator calls per layer. Where the kernel choice's ops are "c", the
small operators between the projections run in C instead (`engine/kernels/c_layer_ops.py`: each residual add
with the norm after it, rotary embedding with the KV write, SiLU gating; the norm and SiLU
within the last bit of torch's, `tests/engine/kernels/test_c_ops.py`).

It is used in every dtype once `engine/step/fusion.py` has fused Q/K/V and gate/up, for models whose
layers have the modules of pre-norm attention + gated MLP (Llama's RMSNorms, or Gemma's (1 + w)
ones in torch's ops), or Gemma 2's with a norm before and after each branch (`supports`;
`_sandwich_layers`), and compute with them
what the loop computes: the runner's probe step at start-up (`runner.probe`) runs a few tokens
both ways and keeps the loop only where the final hidden states are equal bit for bit (Granite,
say, has Llama's modules but scales its residuals). Anything else goes through transformers'
layers.
Projections are looked up per call, so LoRA wrappers (`workbench/lora/layers.py`) apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.engine.kernels import c_decode_stack, c_layer_ops
from workbench.engine.step.attention import AttentionContext, attend
from workbench.engine.step.fusion import C_KERNELS, FastLinear, FusedPart


def rms_norm(norm, x: torch.Tensor) -> torch.Tensor:
    """transformers' Llama-family `RMSNorm` module `norm` applied to `x` with torch's fused
    kernel: the same ops in the same dtypes (normalise in float32, cast back, then scale; a
    Gemma norm: scale by 1 + w in float32, then cast), bit-identical
    (`tests/engine/step/test_decoder.py`) in about a third of the time."""
    if _is_gemma_norm(norm):
        return _gemma_norm(x, gemma_norm_terms(norm))
    return _rms_norm(x, norm.weight, norm.variance_epsilon)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm` on the norm's weight and epsilon, looked up once (`DecoderStack._plan`)."""
    return torch.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype) * weight


def _is_rms_norm(norm) -> bool:
    return type(norm).__name__.endswith("RMSNorm") and hasattr(norm, "variance_epsilon")


def _is_gemma_norm(norm) -> bool:
    """Gemma's and Gemma 2's RMSNorm: x normalised and scaled by (1 + w) in float32, then cast
    (Llama's casts first and scales by w)."""
    return type(norm).__name__ in ("GemmaRMSNorm", "Gemma2RMSNorm") and hasattr(norm, "eps")


def gemma_norm_terms(norm) -> tuple[torch.Tensor, float]:
    """A Gemma norm's (1 + w in float32, epsilon): what `_gemma_norm` takes, computed once."""
    return 1.0 + norm.weight.float(), norm.eps


def _gemma_norm(x: torch.Tensor, terms: tuple[torch.Tensor, float]) -> torch.Tensor:
    """transformers' `Gemma2RMSNorm` on x with torch's fused kernel: the same ops in the same
    dtypes (normalise in float32, times 1 + w in float32, cast back), bit-identical."""
    scale, eps = terms
    return (torch.rms_norm(x.float(), scale.shape, None, eps) * scale).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """transformers' `apply_rotary_pos_emb` on `[T, heads, D]` with `cos` `[T, 1, D]` and
    `signed_sin` from `_signed_sin`: `cat(-x2, x1) * sin` is `cat(x2, x1) * cat(-sin1, sin2)`
    bit for bit (negation is exact), one operator fewer per layer."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((x2, x1), dim=-1) * signed_sin


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin [..., D] with its first half negated (once per step, for `_rotate`)."""
    s1, s2 = sin.chunk(2, dim=-1)
    return torch.cat((-s1, s2), dim=-1)


@dataclass(frozen=True)
class LayerStep:
    """What the loop calls in one layer, looked up once (module attribute lookups cost more
    than the small ops between them): the norms' weights and epsilons, the projections'
    forward methods (LoRA wrappers included), the activation, the scaling and the window."""

    norm1: tuple[torch.Tensor, float]
    qkv: Any
    o: Any
    norm2: tuple[torch.Tensor, float]
    gate_up: Any
    down: Any
    act: Any
    scaling: float
    window: int | None
    softcap: float | None = None  # the attention scores' (Gemma 2's)
    # Gemma 2's sandwich norms, each `gemma_norm_terms`: (input, after attention, before the
    # MLP, after it); None in a pre-norm layer (norm1, norm2 are its two)
    sandwich: tuple[tuple[torch.Tensor, float], ...] | None = None


@dataclass(frozen=True)
class CLayer:
    """One layer's modules when a decode step can run in one C call (`DecoderStack._c_step`):
    its two RMSNorms and its four projections, each a plain `FastLinear` with C products."""

    input_norm: Any
    qkv: FastLinear
    o: FastLinear
    post_norm: Any
    gate_up: FastLinear
    down: FastLinear

    @property
    def projections(self) -> tuple[FastLinear, FastLinear, FastLinear, FastLinear]:
        return self.qkv, self.o, self.gate_up, self.down


class DecoderStack:
    """Runs `model.model.layers` on a packed row (see the module docstring)."""

    c_layers: list[CLayer] | None  # see `_c_layers`
    _c_tables_for: list | None = None  # the KV caches `_c_tables` holds the addresses of
    _c_tables: tuple[Any, Any]

    windows: list[int | None]  # each layer's sliding window (the runner's probe says)
    gemma_norms: bool = False  # pre-norm layers with Gemma's norms (`_plan` says)

    def __init__(self, model, layers, c_ops: bool = False, one_call_rows: int | None = None):
        self.layers = list(layers)
        # decode steps of at most this many rows (None: any the C products take) in one C call
        # (`_c_step`): a batch-invariant engine's, the rows its products' dot products take,
        # where each row's bits are the loop's whatever the count
        self.one_call_rows = one_call_rows
        self.windows = [None] * len(self.layers)
        # where the kernel choice's ops are "c": rotary embedding and the KV write in C
        # (`c_layer_ops.rope_write_kv`, bit for bit torch's), each residual add with the norm after it
        # (`c_layer_ops.add_rms_norm`) and SiLU's gating (`c_layer_ops.silu_mul`): these two not bit-identical
        # to the layers (the mean's order, exp's last bit)
        self.c_ops = c_ops
        self.silu = all(type(layer.mlp.act_fn).__name__ in ("SiLU", "SiLUActivation")
                        for layer in self.layers)  # what `c_layer_ops.silu_mul` computes
        cfg = model.config
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.refresh()

    @staticmethod
    def supports(model, layers: Any) -> bool:
        """Whether every layer has the modules of the plain pre-norm layer (Llama's RMSNorms
        or Gemma's, fused Q/K/V and equal gate and up, no QK norms) or Gemma 2's (four of its
        norms), and the base model a rotary embedding and such a norm last (whether they
        compute what the loop does, the probe step tells)."""
        base = getattr(model, "model", None)
        final = getattr(base, "norm", None)
        if not ((_is_rms_norm(final) or _is_gemma_norm(final)) and hasattr(base, "rotary_emb")
                and id(getattr(base, "layers", None)) == id(layers)):
            return False
        for layer in layers:
            attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            if any(hasattr(attn, name) for name in ("q_norm", "k_norm", "q_layernorm")):
                return False
            gate = getattr(mlp, "gate_proj", None)
            norms = _sandwich_norms(layer) or (
                getattr(layer, "input_layernorm", None),
                getattr(layer, "post_attention_layernorm", None))
            if not (isinstance(getattr(attn, "q_proj", None), FusedPart)
                    and isinstance(gate, FusedPart) and len(set(gate.group.sizes)) == 1
                    and hasattr(mlp, "act_fn") and (
                        all(map(_is_gemma_norm, norms)) or
                        len(norms) == 2 and all(map(_is_rms_norm, norms)))):
                return False
        return True

    def __call__(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 ctx: AttentionContext, stop: int | None = None) -> torch.Tensor:
        """hidden: [T, H]; cos, sin: [T, D] -> [T, H] after the last layer (before the norm),
        or with `stop`, after layer `stop - 1` (no later layer computed)."""
        t = hidden.shape[0]
        hq, d = self.num_heads, self.head_dim
        c_ops = self.c_ops
        c_silu = c_ops and self.silu
        cos_c, sin_c = cos, _signed_sin(sin)  # [T, D], as the C function takes them
        inspector = ctx.inspector  # a step that records or intervenes: `engine/step/inspection.py`
        if self.plan and self.plan[0].sandwich is not None:
            return self._sandwich_layers(hidden, cos_c, sin_c, ctx, stop)
        if c_ops and self.c_layers is not None and ctx.num_decode == t and ctx.c_attention \
                and stop is None:
            cuts = [] if inspector is None else self._residual_cuts(inspector)
            if cuts is not None:
                out = self._c_segments(hidden, cos_c, sin_c, ctx, inspector, cuts)
                if out is not None:
                    return out
        cos, sin = cos_c.unsqueeze(1), sin_c.unsqueeze(1)  # [T, 1, D]
        add_norm = self._add_norm
        delta = None  # the last layer's MLP output, added with the next layer's input norm
        plan = self.plan if stop is None else self.plan[:stop]
        for i, step in enumerate(plan):
            (w1, eps1), (w2, eps2) = step.norm1, step.norm2
            o_proj = step.o
            hidden, x = add_norm(hidden, delta, w1, eps1)
            if inspector is not None:  # hidden is layer i - 1's resid_post and i's resid_pre
                changed = inspector.visit("resid_post", i - 1, hidden) if i else []
                x = self._renorm(hidden, x, changed + inspector.visit("resid_pre", i, hidden),
                                 w1, eps1)
            out = self._attend(ctx, i, step, step.qkv(x), cos_c, sin_c, cos, sin)
            if inspector is not None:
                inspector.visit("z", i, out)
                attn = o_proj(out.reshape(t, hq * d))
                inspector.visit("attn_out", i, attn)
                hidden, x = add_norm(hidden, attn, w2, eps2)
                x = self._renorm(hidden, x, inspector.visit("resid_mid", i, hidden), w2, eps2)
            else:
                hidden, x = add_norm(hidden, o_proj(out.reshape(t, hq * d)), w2, eps2)
            gate_up = step.gate_up(x)
            y = c_layer_ops.silu_mul(gate_up) if c_silu else None
            if y is None:
                gate, up = gate_up.chunk(2, dim=-1)
                y = step.act(gate) * up
            delta = step.down(y)
            if inspector is not None:
                inspector.visit("mlp_out", i, delta)
        hidden = hidden if delta is None else hidden + delta
        if inspector is not None:
            inspector.visit("resid_post", len(plan) - 1, hidden)
        return hidden

    def _sandwich_layers(self, hidden: torch.Tensor, cos_c: torch.Tensor,
                         sin_c: torch.Tensor, ctx: AttentionContext, stop: int | None
                         ) -> torch.Tensor:
        """`__call__` for Gemma 2's layers: each branch between two norms of its own (attention
        in `input_layernorm` .. `post_attention_layernorm`, the MLP in `pre_feedforward_layernorm`
        .. `post_feedforward_layernorm`), its output added to the residual stream. The hook
        points where transformers' modules have them (`Sites` of gemma2: `attn_out` and
        `mlp_out` the post-norms' outputs, `resid_mid` the pre-MLP norm's input), visited
        before what reads them, so that a change made there is what the rest computes on."""
        t = hidden.shape[0]
        hq, d = self.num_heads, self.head_dim
        cos, sin = cos_c.unsqueeze(1), sin_c.unsqueeze(1)  # [T, 1, D]
        inspector = ctx.inspector
        plan = self.plan if stop is None else self.plan[:stop]
        for i, step in enumerate(plan):
            assert step.sandwich is not None
            norm_in, norm_attn, norm_pre, norm_post = step.sandwich
            if inspector is not None:  # hidden is layer i - 1's resid_post and i's resid_pre
                if i:
                    inspector.visit("resid_post", i - 1, hidden)
                inspector.visit("resid_pre", i, hidden)
            out = self._attend(ctx, i, step, step.qkv(_gemma_norm(hidden, norm_in)), cos_c,
                               sin_c, cos, sin)
            if inspector is not None:
                inspector.visit("z", i, out)
            attn = _gemma_norm(step.o(out.reshape(t, hq * d)), norm_attn)
            if inspector is not None:
                inspector.visit("attn_out", i, attn)
            hidden = hidden + attn
            if inspector is not None:
                inspector.visit("resid_mid", i, hidden)
            gate, up = step.gate_up(_gemma_norm(hidden, norm_pre)).chunk(2, dim=-1)
            mlp = _gemma_norm(step.down(step.act(gate) * up), norm_post)
            if inspector is not None:
                inspector.visit("mlp_out", i, mlp)
            hidden = hidden + mlp
        if inspector is not None:
            inspector.visit("resid_post", len(plan) - 1, hidden)
        return hidden

    def _attend(self, ctx: AttentionContext, i: int, step: LayerStep, qkv: torch.Tensor,
                cos_c: torch.Tensor, sin_c: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        """Layer i's attention of its fused Q/K/V rows qkv [T, (Hq + 2Hkv) D]: queries and
        keys rotated, K/V written to the cache (in C with `c_ops`: `cos_c`, `sin_c` [T, D]; else
        torch's, `cos`, `sin` [T, 1, D]), each query attended -> [T, Hq, D]."""
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q = c_layer_ops.rope_write_kv(qkv, cos_c, sin_c, ctx.slot_mapping, *ctx.kv_caches[i],
                                      hq, hkv) if self.c_ops else None
        if q is not None:  # K/V rotated and written in C
            return attend(ctx, i, q, None, None, step.scaling, step.window, step.softcap)
        t = qkv.shape[0]
        qk = _rotate(qkv[:, :(hq + hkv) * d].view(t, hq + hkv, d), cos, sin)
        v = qkv[:, (hq + hkv) * d:].view(t, hkv, d)
        return attend(ctx, i, qk[:, :hq], qk[:, hq:], v, step.scaling, step.window,
                      step.softcap)

    def _renorm(self, hidden: torch.Tensor, x: torch.Tensor, rows: list[int],
                weight: torch.Tensor, eps: float) -> torch.Tensor:
        """x with the norm of the residual rows an intervention changed computed again, by
        the norm the loop's adds use (in C with `c_ops`: what a cut C step computes for them,
        `_c_segments`); the others' untouched, bit for bit what they were."""
        if rows:
            index = torch.tensor(sorted(set(rows)), device=hidden.device)
            x = x.clone()
            x[index] = self._add_norm(hidden[index], None, weight, eps)[1]
        return x

    @staticmethod
    def _residual_cuts(inspector: Any) -> list[int] | None:
        """Where a decode step in C must stop for `inspector`: the layer boundaries (c: before
        layer c, the last after the last layer) at which it reads or changes the residual
        stream (a layer's `resid_pre`, one's `resid_post`: captures, steering, the logit lens),
        when that is all its work; None where it wants more (inside a layer, patterns, the
        embedding's output at boundary 0, before any C call could say it refuses)."""
        if inspector.pattern_layers:
            return None
        cuts = set()
        for site, layer in inspector.sites:
            if layer is None or site not in ("resid_pre", "resid_post"):
                return None
            cuts.add(layer + (site == "resid_post"))
        return None if 0 in cuts else sorted(cuts)

    def _c_segments(self, hidden: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                    ctx: AttentionContext, inspector: Any, cuts: list[int]
                    ) -> torch.Tensor | None:
        """A step of decodes in C (`_c_step`), one call per stretch of layers between `cuts`,
        the inspector visiting the residual rows at each cut as the loop does (`resid_post`
        of the layer before, then `resid_pre` of the next: changes in place, which the next
        call's first norm reads). The same C functions in the same order as the loop, so the
        same bits. None where the first call refuses (nothing visited yet: the loop runs)."""
        start, last = 0, len(self.layers)
        for cut in [*cuts, last] if not cuts or cuts[-1] != last else cuts:
            if cut > start:
                out = self._c_step(hidden, cos, signed_sin, ctx, start, cut - start)
                if out is None:
                    if start == 0:
                        return None
                    raise RuntimeError("a decode step's C call refused its later layers")
                hidden = out
                start = cut
            if cut in cuts:
                inspector.visit("resid_post", cut - 1, hidden)
                if cut < last:
                    inspector.visit("resid_pre", cut, hidden)
        return hidden

    def _add_norm(self, hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden + delta, its RMSNorm): in C in one pass when `c_ops` (and the C function
        takes the shape), else torch's ops, bit-identical to the layers'. Gemma's norms (the
        plan's `gemma_norms`: `weight` is 1 + w in float32) in torch's ops."""
        if self.gemma_norms:
            if delta is not None:
                hidden = hidden + delta
            return hidden, _gemma_norm(hidden, (weight, eps))
        if self.c_ops:
            both = c_layer_ops.add_rms_norm(hidden, delta, weight, eps)
            if both is not None:
                return both
        if delta is not None:
            hidden = hidden + delta
        return hidden, _rms_norm(hidden, weight, eps)

    def _c_step(self, hidden: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                ctx: AttentionContext, first: int = 0, count: int | None = None
                ) -> torch.Tensor | None:
        """A step of decodes only through `count` layers from `first` (default: every layer) in
        one C call (`c_decode_stack.decode_stack`): the loop's C functions in the loop's
        order, without the interpreter between them. None where it does not apply (more rows
        than the C products take, another dtype): the loop runs instead."""
        assert self.c_layers is not None
        rows, dtype = hidden.shape[0], hidden.dtype
        if self.one_call_rows is not None and rows > self.one_call_rows:
            return None
        if ctx.decode_slots is None or ctx.decode_lengths is None or any(
                lin.c_function(rows, dtype) is None for lin in self.c_layers[0].projections):
            return None
        if self._c_tables_for is not ctx.kv_caches:  # the caches' addresses, once per runner
            layers = [(c.input_norm.weight, c.qkv.c_weight(), c.qkv.bias, c.o.c_weight(),
                       c.o.bias, c.post_norm.weight, c.gate_up.c_weight(), c.gate_up.bias,
                       c.down.c_weight(), c.down.bias, *kv,
                       *(lin.c_function(rows, dtype) for lin in c.projections))
                      for c, kv in zip(self.c_layers, ctx.kv_caches)]
            eps = [(c.input_norm.variance_epsilon, c.post_norm.variance_epsilon)
                   for c in self.c_layers]
            self._c_tables = c_decode_stack.stack_table(layers, eps)
            self._c_tables_for = ctx.kv_caches
        return c_decode_stack.decode_stack(
            self._c_tables, len(self.layers) if count is None else count, hidden, cos,
            signed_sin, ctx.slot_mapping, ctx.decode_slots, ctx.decode_lengths, self.num_heads,
            self.num_kv_heads, self.head_dim, self.c_layers[0].gate_up.out_features // 2,
            self.scaling or self.head_dim ** -0.5, first)

    def refresh(self) -> None:
        """Looks the layers' modules up again (after LoRA wrappers replaced projections)."""
        self.plan = self._plan()
        self.c_layers = self._c_layers()
        self._c_tables_for = None

    def _c_layers(self) -> list[CLayer] | None:
        """Each layer's `CLayer` when a decode step can run in one C call (`_c_step`): ops "c",
        SiLU, every projection a plain `FastLinear` (no LoRA wrapper) with C products, each
        projection on the same kernel in every layer (so that layer 0's say which row counts
        the step takes), one scaling, no sliding window (the C attention reads whole
        contexts); else None."""
        if not (self.c_ops and self.silu) or any(
                w is not None for w in self.windows) or self.gemma_norms \
                or self.plan[0].sandwich is not None:
            return None
        layers: list[CLayer] = []
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            c = CLayer(layer.input_layernorm, attn.q_proj.group.linear, attn.o_proj,
                       layer.post_attention_layernorm, mlp.gate_proj.group.linear, mlp.down_proj)
            if not all(type(lin) is FastLinear and lin.c_weight() is not None
                       and lin.kernel.name in C_KERNELS for lin in c.projections):
                return None
            dtypes = {c.input_norm.weight.dtype, c.post_norm.weight.dtype}
            if len(dtypes) != 1 or not all(t.is_contiguous() for t in (c.input_norm.weight,
                                                                        c.post_norm.weight)):
                return None
            layers.append(c)
        kernels = {tuple(lin.kernel.name for lin in c.projections) for c in layers}
        scalings = {layer.self_attn.scaling for layer in self.layers}
        if len(kernels) != 1 or len(scalings) != 1:
            return None
        self.scaling = scalings.pop()
        return layers

    def _plan(self) -> list[LayerStep]:
        """Per layer, the norms' weights and the forward methods the loop calls, looked up
        once (module attribute lookups cost more than the small ops between them)."""
        plan = []
        # Gemma's pre-norm layers: its (1 + w) norms, (1 + w, eps) in norm1 and norm2
        self.gemma_norms = _is_gemma_norm(self.layers[0].input_layernorm) and \
            _sandwich_norms(self.layers[0]) is None
        for layer, window in zip(self.layers, self.windows):
            attn, mlp = layer.self_attn, layer.mlp
            sandwich = _sandwich_norms(layer)
            a, b = layer.input_layernorm, layer.post_attention_layernorm
            if sandwich is not None:  # Gemma 2's: the four norms carry the layer
                terms = tuple(gemma_norm_terms(norm) for norm in sandwich)
                norm1, norm2 = terms[0], terms[2]  # the norms its branches read
            elif self.gemma_norms:
                norm1, norm2 = gemma_norm_terms(a), gemma_norm_terms(b)
            else:
                norm1, norm2 = (a.weight, a.variance_epsilon), (b.weight, b.variance_epsilon)
            plan.append(LayerStep(norm1, attn.q_proj.group.linear.forward, attn.o_proj.forward,
                                  norm2, mlp.gate_proj.group.linear.forward,
                                  mlp.down_proj.forward, mlp.act_fn.forward, attn.scaling,
                                  window, getattr(attn, "attn_logit_softcapping", None),
                                  None if sandwich is None else terms))
        return plan


def _sandwich_norms(layer) -> tuple[Any, Any, Any, Any] | None:
    """Gemma 2's four norms of a layer (input, after attention, before and after the MLP), or
    None where the layer has no norm after its MLP (a pre-norm layer)."""
    post = getattr(layer, "post_feedforward_layernorm", None)
    if post is None:
        return None
    return (getattr(layer, "input_layernorm", None),
            getattr(layer, "post_attention_layernorm", None),
            getattr(layer, "pre_feedforward_layernorm", None), post)
