"""Where each family of transformers' causal LMs keeps what the engine reaches into, said once.

A family's `Architecture` names its modules by attribute path from the `...ForCausalLM`
object: the base model whose forward the engine runs (`base`), the token embedding (`embed`,
for prompt embeddings), the decoder layers (`layers`), and what the causal LM does to the LM
head's output before returning it (`logits`: Gemma 2's soft-capping, Granite's and Cohere's
scaling). Everything else — positions (rotary, partial rotary, learned tables), norms,
parallel attention and MLP, QK norms, per-layer rope bases, attention soft-capping, sliding
windows — stays in transformers' own modules, which the engine runs as they are with its paged
attention in place of theirs (`engine/step/attention.py`). Two families compute attention in their
attention module instead of calling transformers' attention interface (BLOOM's and Falcon's
ALiBi, Falcon's fused heads): `attention` names the engine's stand-in for that module's forward
(`engine/step/attention_modules.py`), the same arithmetic up to the attention itself. Nothing else
in a family may depend on the batch beyond the sequence (what does is refused, saying why).

`architecture_of(config)` returns a config's family or raises `UnsupportedModelError` naming
its `model_type`, the feature at fault where there is one, and the supported types. Like
vLLM's model registry, much smaller: no code per family, only where things are.

>>> architecture_of(type("C", (), {"model_type": "gpt2"})()).layers
'transformer.h'
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from workbench.errors import ValidationError


class UnsupportedModelError(ValidationError):
    """A model the engine cannot run exactly, refused when it loads."""


@dataclass(frozen=True)
class Architecture:
    """Attribute paths (from the causal LM) of one family; see the module docstring."""

    family: str
    base: str  # the base model: its forward is embeddings -> layers -> final norm
    embed: str  # the token embedding module
    layers: str  # the decoder layers (a ModuleList)
    positions: str  # how positions enter (documentation: the table in docs/models.md)
    logits: tuple[str, str] | None = None  # (op, config attribute) after the LM head
    features: str = ""  # what else its layers do (documentation: the table in docs/models.md)
    attention: str | None = None  # the engine's stand-in for its attention module's forward
    sites: Sites | None = None  # where TransformerLens's hook points are (None: `LLAMA_SITES`)


@dataclass(frozen=True)
class Sites:
    """Where a layer's TransformerLens hook points are, by attribute path from the layer (and
    the final norm's from the base model): `attn_out` / `mlp_out` are the outputs of the
    modules whose results are added to the residual stream; `resid_mid` is the input of the
    module the MLP branch reads first (None where attention and MLP run in parallel, as
    TransformerLens has no `hook_resid_mid` there); `z` the input of the attention's output
    projection (each head's output, concatenated)."""

    attn_out: str
    mlp_out: str
    resid_mid: str | None
    z: str
    final_norm: str


LLAMA_SITES = Sites("self_attn", "mlp", "post_attention_layernorm", "self_attn.o_proj", "norm")
_POST_NORMED = Sites("post_attention_layernorm", "post_feedforward_layernorm",
                     "pre_feedforward_layernorm", "self_attn.o_proj", "norm")


def _llama_like(family: str, positions: str = "rotary", logits: tuple[str, str] | None = None,
                features: str = "", sites: Sites | None = None) -> Architecture:
    return Architecture(family, "model", "model.embed_tokens", "model.layers", positions, logits,
                        features, sites=sites)


ARCHITECTURES: MappingProxyType[str, Architecture] = MappingProxyType({
    "llama": _llama_like("llama"),
    "mistral": _llama_like("mistral", features="sliding window (all layers)"),
    "qwen2": _llama_like("qwen2", features="Q/K/V biases; sliding window from "
                                           "max_window_layers"),
    "qwen3": _llama_like("qwen3", features="QK norms; sliding window from max_window_layers"),
    "qwen2_moe": _llama_like("qwen2_moe", features="mixture of experts, shared expert"),
    "mixtral": _llama_like("mixtral", features="mixture of experts; sliding window"),
    "gemma": _llama_like("gemma", features="embeddings scaled by sqrt(hidden); (1 + w) RMSNorm"),
    "gemma2": _llama_like("gemma2", logits=("softcap", "final_logit_softcapping"),
                          features="attention and final soft-capping; local / global layers",
                          sites=_POST_NORMED),
    "gemma3_text": _llama_like("gemma3_text", logits=("softcap", "final_logit_softcapping"),
                               features="QK norms; local / global layers with their own rope "
                                        "bases", sites=_POST_NORMED),
    "phi": _llama_like("phi", positions="partial rotary",
                       features="parallel attention + MLP, LayerNorm, biases",
                       sites=Sites("self_attn", "mlp", None, "self_attn.dense", "final_layernorm")),
    "phi3": _llama_like("phi3", features="fused QKV and gate/up; sliding window"),
    "olmo2": _llama_like("olmo2", features="post-norms, QK norms", sites=Sites(
        "post_attention_layernorm", "post_feedforward_layernorm", "mlp", "self_attn.o_proj",
        "norm")),
    "granite": _llama_like("granite", logits=("divide", "logits_scaling"),
                           features="embedding, residual and attention multipliers"),
    "starcoder2": _llama_like("starcoder2", features="LayerNorm, biases, plain MLP; "
                                                     "sliding window"),
    "cohere": _llama_like("cohere", logits=("multiply", "logit_scale"),
                          features="parallel attention + MLP, LayerNorm, interleaved rotary",
                          sites=Sites("self_attn", "mlp", None, "self_attn.o_proj", "norm")),
    "stablelm": _llama_like("stablelm", positions="partial rotary",
                            features="LayerNorm; optional QK norms and parallel residual"),
    "gpt2": Architecture("gpt2", "transformer", "transformer.wte", "transformer.h",
                         "learned", features="Conv1D projections, LayerNorm, biases",
                         sites=Sites("attn", "mlp", "ln_2", "attn.c_proj", "ln_f")),
    "gpt_neox": Architecture("gpt_neox", "gpt_neox", "gpt_neox.embed_in", "gpt_neox.layers",
                             "partial rotary", features="parallel attention + MLP, fused QKV, "
                                                        "untied head",
                             sites=Sites("attention", "mlp", "post_attention_layernorm",
                                         "attention.dense", "final_layer_norm")),
    "opt": Architecture("opt", "model.decoder", "model.decoder.embed_tokens",
                        "model.decoder.layers", "learned (offset 2)",
                        features="LayerNorm before or after, optional projections in and out",
                        sites=Sites("self_attn", "fc2", "final_layer_norm", "self_attn.out_proj",
                                    "final_layer_norm")),
    "gptj": Architecture("gptj", "transformer", "transformer.wte", "transformer.h",
                         "partial rotary (interleaved)", features="parallel attention + MLP",
                         sites=Sites("attn", "mlp", None, "attn.out_proj", "ln_f")),
    "bloom": Architecture("bloom", "transformer", "transformer.word_embeddings", "transformer.h",
                          "ALiBi", features="embedding LayerNorm, fused QKV, biases",
                          attention="bloom", sites=Sites(
                              "self_attention.dense", "mlp.dense_4h_to_h",
                              "post_attention_layernorm", "self_attention.dense", "ln_f")),
    "falcon": Architecture("falcon", "transformer", "transformer.word_embeddings",
                           "transformer.h", "rotary or ALiBi",
                           features="parallel attention + MLP, multi-query or grouped fused QKV",
                           attention="falcon", sites=Sites(
                               "self_attention", "mlp", "post_attention_layernorm",
                               "self_attention.dense", "ln_f")),
})

# rope scalings whose frequencies depend on the longest position of the whole call: a packed
# batch would give each sequence the batch's (transformers recomputes them per forward)
_LENGTH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})


def supported_types() -> list[str]:
    return sorted(ARCHITECTURES)


def refuse(config: Any, why: str) -> UnsupportedModelError:
    """The refusal of a model: its `model_type` (and architectures), why, the supported types."""
    model_type = getattr(config, "model_type", None)
    archs = getattr(config, "architectures", None) or []
    named = f"model_type {model_type!r}" + (f" ({', '.join(archs)})" if archs else "")
    return UnsupportedModelError(
        f"The engine cannot run {named} exactly: {why}. Supported model types: "
        f"{', '.join(supported_types())}.", parameter="model", value=model_type)


def architecture_of(config: Any) -> Architecture:
    """The family of a causal LM's config; raises `UnsupportedModelError` (see the module
    docstring) for one the engine would not run exactly."""
    model_type = getattr(config, "model_type", None)
    arch = ARCHITECTURES.get(model_type)  # type: ignore[arg-type]
    if arch is None:
        raise refuse(config, "its family is not one the engine knows the layout of")
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None)
    ropes = rope.values() if isinstance(rope, dict) and all(
        isinstance(v, dict) for v in rope.values()) else [rope]
    for params in ropes:
        kind = (params or {}).get("rope_type") or (params or {}).get("type") \
            if isinstance(params, dict) else None
        if kind in _LENGTH_DEPENDENT_ROPE:
            raise refuse(config, f"rope scaling {kind!r} sets its frequencies from the longest "
                                  "position of the whole forward, which in a packed batch is "
                                  "another sequence's")
    if model_type == "bloom" and getattr(config, "pretraining_tp", 1) > 1 and getattr(
            config, "slow_but_exact", False):
        raise refuse(config, "slow_but_exact with pretraining_tp > 1 splits its output "
                              "projection into slices the engine does not reproduce")
    return arch


def sites_of(arch: Architecture, config: Any) -> tuple[Sites, dict[str, str]]:
    """A model's hook points and the sites it does not have, each with why (a config may run
    attention and MLP in parallel, or normalise after the residual add)."""
    sites = arch.sites or LLAMA_SITES
    missing: dict[str, str] = {}
    parallel = sites.resid_mid is None or any(getattr(config, name, False) for name in (
        "use_parallel_residual", "parallel_attn", "new_decoder_architecture"))
    if parallel:
        missing["resid_mid"] = ("its attention and MLP read the same residual stream in "
                                "parallel (TransformerLens has no hook_resid_mid there either)")
    if getattr(config, "do_layer_norm_before", True) is False or getattr(
            config, "apply_residual_connection_post_layernorm", False):
        why = "it normalises after the residual add, so its residual stream is not the sum"
        missing.update(resid_mid=why)
    return sites, missing


# The KV-layout keys a family's attention never reads, though a config may carry them (one
# converted or merged by another tool; transformers keeps any unknown key as an attribute): its
# layers compute `hidden_size // num_attention_heads` per head, one key / value head per query
# head (Falcon: its own `num_kv_heads` / `multi_query`). StableLM's rotary embedding does read
# `head_dim`, its attention does not (transformers' own forward fails where they differ).
IGNORED_LAYOUT_KEYS: MappingProxyType[str, tuple[str, ...]] = MappingProxyType({
    family: ("num_key_value_heads", "head_dim")
    for family in ("gpt2", "gpt_neox", "opt", "gptj", "bloom", "falcon")} | {
    "stablelm": ("head_dim",)})


def kv_heads(config: Any) -> int:
    """How many key / value heads a layer writes to the KV cache (the runner's probe step
    checks it against what the layers compute)."""
    model_type = getattr(config, "model_type", None)
    if model_type == "falcon":  # its `_split_heads`
        if config.new_decoder_architecture:
            return config.num_kv_heads
        return 1 if config.multi_query else config.num_attention_heads
    if "num_key_value_heads" in IGNORED_LAYOUT_KEYS.get(model_type or "", ()):
        return config.num_attention_heads
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def head_size(config: Any) -> int:
    """The size of each key / value head (checked by the probe step as `kv_heads`)."""
    heads = config.num_attention_heads
    if "head_dim" in IGNORED_LAYOUT_KEYS.get(getattr(config, "model_type", None) or "", ()):
        return config.hidden_size // heads
    return getattr(config, "head_dim", None) or config.hidden_size // heads


def stray_layout_keys(config: Any) -> list[str]:
    """`key=value` for each KV-layout key the config sets that its family's attention does
    not read (`IGNORED_LAYOUT_KEYS`), for a refusal to name."""
    keys = IGNORED_LAYOUT_KEYS.get(getattr(config, "model_type", None) or "", ())
    return [f"{key}={config.__dict__[key]!r}" for key in keys
            if config.__dict__.get(key) is not None]


def module_at(root: Any, path: str) -> Any:
    """The module at a dotted attribute path (`Architecture`'s fields)."""
    for name in path.split("."):
        root = getattr(root, name)
    return root


def apply_logits(arch: Architecture, config: Any, logits: Any) -> Any:
    """What the family's causal LM does to the LM head's output, in the same ops and order."""
    if arch.logits is None:
        return logits
    op, attribute = arch.logits
    value = getattr(config, attribute, None)
    if value is None:
        return logits
    if op == "softcap":
        return (logits / value).tanh() * value
    if op == "divide":
        return logits / value
    return logits * value
