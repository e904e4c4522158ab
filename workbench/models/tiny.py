"""Tiny random models of the real architectures, built in memory for fast tests.

`tiny_model("llama")` (or any family of `TINY_ARCHITECTURES`: the decoder families of
`workbench/models/architectures.py` and "bert") builds a 2-layer model with
hidden size 64 from a seeded generator, so the same seed gives the same weights, and pairs it
with a real tokenizer shipped in this package (`workbench/models/tokenizers/`): SmolLM2's
(vocabulary 49,152, ChatML template) for the generative ones, MiniLM's for bert. `overrides`
change the config (`tiny_model("mistral", sliding_window=8)`). Each family's config keeps what
makes it itself: partial rotary (phi, stablelm, gpt_neox, gptj), Gemma 2's local and global
layers (window 8) with soft-capping, Granite's multipliers, Cohere's logit scale, experts. No model package or
download is needed, so the tiny tests run on any bare machine (a CUDA one included). Prompts are
real text; outputs are noise.
"""

from __future__ import annotations

from pathlib import Path

import torch

from workbench.models.devices import resolve_device, resolve_dtype
from workbench.models.loader import LoadedModel, prepare_for_inference

TOKENIZERS = Path(__file__).with_name("tokenizers")  # SmolLM2's and MiniLM's, as package data

_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
_NO_GQA = dict(num_key_value_heads=None)  # families whose config has no KV head count
# per family, what its tiny config sets beyond the shared shape
_FAMILY: dict[str, dict] = {
    "llama": dict(tie_word_embeddings=True),
    "qwen2": dict(tie_word_embeddings=True),  # q/k/v projections with bias
    "mistral": dict(tie_word_embeddings=False, sliding_window=None),
    "qwen3": {}, "gemma": {}, "phi3": {}, "olmo2": {}, "starcoder2": {},
    "gemma2": dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16),
    "gemma3_text": dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16),
    "phi": dict(partial_rotary_factor=0.5),
    "stablelm": dict(partial_rotary_factor=0.25),
    "granite": dict(embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2,
                    logits_scaling=3.0),
    "cohere": dict(logit_scale=0.5),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64),
    "gpt2": dict(_NO_GQA, n_inner=128),
    "gpt_neox": dict(_NO_GQA, rotary_pct=0.25, tie_word_embeddings=False),
    "opt": dict(_NO_GQA, ffn_dim=128, word_embed_proj_dim=64),
    "gptj": dict(_NO_GQA, rotary_dim=8, n_inner=128),
    "falcon": {}, "bloom": _NO_GQA,
}
TINY_ARCHITECTURES = (*_FAMILY, "bert")


def tiny_config(arch: str, tokenizer, **overrides):
    """The config of a tiny `arch` model whose vocabulary and special tokens match `tokenizer`."""
    # deferred: transformers is heavy to import and only building a model needs it
    from transformers import AutoConfig, BertConfig

    special = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    if arch == "bert":
        return BertConfig(**_SHAPE, **special, max_position_embeddings=512, **overrides)
    if arch not in _FAMILY:
        raise ValueError(f"Unknown tiny architecture {arch!r}; choose one of "
                         f"{TINY_ARCHITECTURES}.")
    decoder = dict(**_SHAPE, **special, num_key_value_heads=2, max_position_embeddings=2048,
                   bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   initializer_range=0.1)  # wider than the default 0.02: fewer near-ties in logits
    decoder.update(_FAMILY[arch], **overrides)
    decoder = {k: v for k, v in decoder.items() if v is not None or k == "sliding_window"}
    return AutoConfig.for_model(arch, **decoder)


def tiny_model(arch: str = "llama", *, seed: int = 0, dtype: str | torch.dtype = "float32",
               device: str = "cpu", **overrides) -> LoadedModel:
    """A tiny random `arch` model with a real tokenizer; same seed, same weights.

    >>> tiny_model("llama").config.num_hidden_layers
    2
    """
    # deferred: transformers is heavy to import and only building a model needs it
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    if arch not in TINY_ARCHITECTURES:
        raise ValueError(f"Unknown tiny architecture {arch!r}; choose one of {TINY_ARCHITECTURES}.")
    kind = "embed" if arch == "bert" else "generate"
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZERS / ("minilm" if kind == "embed"
                                                            else "smollm2"), local_files_only=True)
    config = tiny_config(arch, tokenizer, **overrides)
    auto_class = AutoModel if kind == "embed" else AutoModelForCausalLM
    with torch.random.fork_rng(devices=[]):  # seed without touching the caller's RNG
        torch.manual_seed(seed)
        net = auto_class.from_config(config, dtype=torch.float32)
    if kind == "generate":
        net.generation_config.eos_token_id = tokenizer.eos_token_id
        net.generation_config.pad_token_id = tokenizer.pad_token_id
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    net = prepare_for_inference(net.to(torch_dtype), device)
    return LoadedModel(model=net, tokenizer=tokenizer, config=net.config, path=None,
                       served_name=f"tiny-{arch}", kind=kind, dtype=torch_dtype, device=device,
                       max_model_len=config.max_position_embeddings,
                       pooling="mean" if kind == "embed" else None, normalize=kind == "embed")
