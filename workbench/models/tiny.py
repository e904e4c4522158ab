"""Tiny random models of the real architectures, built in memory for fast tests.

`tiny_model("llama")` (also "qwen2", "mistral", "bert") builds a 2-layer model with hidden size
64 from a seeded generator, so the same seed gives the same weights, and pairs it with a real
tokenizer shipped in this package (`workbench/models/tokenizers/`): SmolLM2's (vocabulary
49,152, ChatML template) for the generative ones, MiniLM's for bert. No model package or
download is needed, so the tiny tests run on any bare machine (a CUDA one included). Prompts are
real text; outputs are noise.
"""

from __future__ import annotations

from pathlib import Path

import torch

from workbench.models.devices import resolve_device, resolve_dtype
from workbench.models.loader import LoadedModel, prepare_for_inference

TOKENIZERS = Path(__file__).with_name("tokenizers")  # SmolLM2's and MiniLM's, as package data

TINY_ARCHITECTURES = ("llama", "qwen2", "mistral", "bert")
_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)


def tiny_config(arch: str, tokenizer):
    """The config of a tiny `arch` model whose vocabulary and special tokens match `tokenizer`."""
    # deferred: transformers is heavy to import and only building a model needs it
    from transformers import BertConfig, LlamaConfig, MistralConfig, Qwen2Config

    special = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    if arch == "bert":
        return BertConfig(**_SHAPE, **special, max_position_embeddings=512)
    decoder = dict(**_SHAPE, **special, num_key_value_heads=2, max_position_embeddings=2048,
                   bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   initializer_range=0.1)  # wider than the default 0.02: fewer near-ties in logits
    if arch == "llama":
        return LlamaConfig(**decoder, tie_word_embeddings=True)
    if arch == "qwen2":  # q/k/v projections with bias
        return Qwen2Config(**decoder, tie_word_embeddings=True)
    if arch == "mistral":
        return MistralConfig(**decoder, tie_word_embeddings=False, sliding_window=None)
    raise ValueError(f"Unknown tiny architecture {arch!r}; choose one of {TINY_ARCHITECTURES}.")


def tiny_model(arch: str = "llama", *, seed: int = 0, dtype: str | torch.dtype = "float32",
               device: str = "cpu") -> LoadedModel:
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
    config = tiny_config(arch, tokenizer)
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
