"""What a loaded model and the engine config allow: context length, KV blocks, sampling defaults.

`max_model_len`: the model's position table (an encoder's usable part, sentence-transformers'
`max_seq_length`), lowered (never raised) by the configured limit; a sliding window does not
lower it (the paged attention applies the window).
`num_kv_blocks`: the configured count, or what the KV memory budget holds: `kv_cache_memory_gb`,
or by default (as vLLM's `gpu_memory_utilization` sizes a GPU's cache) `KV_CACHE_UTILIZATION`
of the memory available once the weights are resident, at most what `max_num_seqs` sequences
of `max_model_len` take; refused at start, naming the numbers, when it can't hold one
full-length sequence, or when the budget asked for is more than the machine has. (The cache is
mapped as it fills, `runner.allocate_kv_caches`: a large budget costs nothing until used.) `generation_defaults` / `extra_eos_ids`: what the model's
generation_config.json sets.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.config import EngineConfig
from workbench.engine.step.encoder_runner import max_positions as encoder_max_positions
from workbench.engine.step.runner import kv_bytes_per_token
from workbench.errors import ValidationError


def max_model_len(loaded: Any, config: EngineConfig, is_pooling_model: bool) -> int:
    """The context length the engine serves; raises when the config asks for more."""
    hf = loaded.model.config
    limit = getattr(hf, "max_position_embeddings", None) or 2048
    if is_pooling_model:  # RoBERTa's table holds padding_idx + 1 fewer positions
        limit = min(limit, encoder_max_positions(loaded.model))
    if is_pooling_model and getattr(loaded, "max_model_len", None):
        limit = min(limit, loaded.max_model_len)  # sentence-transformers' max_seq_length
    wanted = config.max_model_len
    if wanted is not None and wanted > limit:
        raise ValidationError(
            f"max_model_len={wanted} is greater than the model's limit of {limit}.",
            parameter="max_model_len", value=wanted)
    return wanted or limit


KV_CACHE_UTILIZATION = 0.9


def num_kv_blocks(hf: Any, dtype: torch.dtype, config: EngineConfig, model_len: int,
                  available: int | None = None) -> int:
    """KV cache blocks (see the module docstring); `available`: the bytes of memory the
    machine has once the weights are resident (None: not known, the budget as given or 1 GiB)."""
    bs = config.block_size
    per_token = kv_bytes_per_token(hf, dtype)
    per_block = per_token * bs
    gb = 2**30
    if config.num_kv_blocks is not None:
        num = config.num_kv_blocks
    elif config.kv_cache_memory_gb is not None:
        if available is not None and config.kv_cache_memory_gb * gb > available:
            raise ValidationError(
                f"kv_cache_memory_gb={config.kv_cache_memory_gb} (--kv-cache-memory) is more "
                f"than the {available / gb:.2f} GB this machine has available after the "
                f"weights. Give it less.", parameter="kv_cache_memory_gb",
                value=config.kv_cache_memory_gb)
        num = int(config.kv_cache_memory_gb * gb // per_block)
    else:
        most = -(-model_len // bs) * config.max_num_seqs  # every sequence at full length
        budget = gb if available is None else int(KV_CACHE_UTILIZATION * available)
        num = min(most, budget // per_block)
        if num * bs < model_len:
            raise ValidationError(
                f"One sequence of max_model_len={model_len} needs {model_len * per_token / gb:.2f}"
                f" GB of KV cache ({per_token / 2**10:.0f} KiB a token), but this machine has "
                f"{(available or budget) / gb:.2f} GB available after the weights (the cache "
                f"takes {KV_CACHE_UTILIZATION:.0%} of it). Lower max_model_len "
                "(--max-model-len) or free memory.", parameter="max_model_len", value=model_len)
    if num * bs < model_len:
        given = "num_kv_blocks" if config.num_kv_blocks is not None else "kv_cache_memory_gb"
        raise ValidationError(
            f"The KV cache holds {num * bs} tokens, fewer than max_model_len="
            f"{model_len}. Give it more memory or lower max_model_len.",
            parameter=given, value=getattr(config, given))
    return num


def generation_defaults(gen: Any) -> dict[str, Any]:
    """The sampling defaults a model's generation_config.json sets (as vLLM's)."""
    if gen is None:
        return {}
    diff = gen.to_diff_dict()
    keys = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
            "min_p": "min_p", "repetition_penalty": "repetition_penalty",
            "max_new_tokens": "max_tokens"}
    return {ours: diff[theirs] for theirs, ours in keys.items() if theirs in diff}


def extra_eos_ids(gen: Any, eos_token_id: int | None) -> set[int]:
    """End-of-sequence ids the generation config adds to the tokenizer's own."""
    extra = getattr(gen, "eos_token_id", None)
    extra = set(extra if isinstance(extra, list) else [extra] if extra is not None else [])
    extra.discard(eos_token_id)
    return extra
