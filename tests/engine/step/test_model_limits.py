"""What a model and the engine config allow, from plain stand-ins for the loaded model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from workbench.config import EngineConfig
from workbench.engine.step.model_limits import (
    extra_eos_ids,
    generation_defaults,
    max_model_len,
    num_kv_blocks,
)
from workbench.errors import ValidationError


def _loaded(**hf) -> SimpleNamespace:
    return SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(**hf)))


def test_the_context_is_the_position_table_whatever_the_sliding_window():
    """The paged attention applies windows, so a window no longer cuts the context (Gemma 2's
    8k stays 8k with its 4k window)."""
    config = EngineConfig()
    assert max_model_len(_loaded(max_position_embeddings=4096), config, False) == 4096
    windowed = _loaded(max_position_embeddings=8192, sliding_window=4096)
    assert max_model_len(windowed, config, False) == 8192
    assert max_model_len(_loaded(), config, False) == 2048  # no table given


def test_a_configured_limit_may_lower_the_context_but_never_raise_it():
    loaded = _loaded(max_position_embeddings=512)
    assert max_model_len(loaded, EngineConfig(max_model_len=100), False) == 100
    with pytest.raises(ValidationError, match="greater than the model's limit of 512") as err:
        max_model_len(loaded, EngineConfig(max_model_len=600), False)
    assert err.value.parameter == "max_model_len"


def test_kv_blocks_come_from_the_count_or_the_memory_budget():
    hf = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=2, hidden_size=64,
                         num_attention_heads=4)  # head_dim 16: 2 * 2 * 2 * 16 * 4 B = 512 B/token
    assert num_kv_blocks(hf, torch.float32, EngineConfig(num_kv_blocks=7), 100) == 7
    budget = EngineConfig(kv_cache_memory_gb=512 * 16 * 10 / 2**30)  # ten blocks of 16 tokens
    assert num_kv_blocks(hf, torch.float32, budget, 100) == 10
    with pytest.raises(ValidationError, match="holds 112 tokens, fewer than max_model_len=200"):
        num_kv_blocks(hf, torch.float32, EngineConfig(num_kv_blocks=7), 200)


def test_by_default_the_cache_takes_most_of_the_memory_left_at_most_what_every_sequence_takes():
    hf = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=2, hidden_size=64,
                         num_attention_heads=4)  # 512 B a token, 8 KiB a block of 16
    config = EngineConfig(max_num_seqs=4)
    # plenty left: 4 sequences of 100 tokens (7 blocks each), no more
    assert num_kv_blocks(hf, torch.float32, config, 100, available=2**30) == 28
    # 100 blocks' worth left: 90% of it
    assert num_kv_blocks(hf, torch.float32, EngineConfig(max_num_seqs=64), 100,
                         available=100 * 8192) == 90


def test_a_cache_that_cannot_hold_one_full_sequence_is_refused_naming_the_numbers():
    hf = SimpleNamespace(num_hidden_layers=32, num_key_value_heads=8, hidden_size=4096,
                         num_attention_heads=32)  # Llama-3.1-8B's: 128 KiB a token in bf16
    with pytest.raises(ValidationError) as err:
        num_kv_blocks(hf, torch.bfloat16, EngineConfig(), 131072, available=6 * 2**30)
    message = str(err.value)
    assert "max_model_len=131072 needs 16.00 GB" in message and "128 KiB a token" in message
    assert "6.00 GB available after the weights" in message
    assert err.value.parameter == "max_model_len"
    # the same model at 8k fits
    assert num_kv_blocks(hf, torch.bfloat16, EngineConfig(), 8192, available=6 * 2**30) > 512


def test_a_budget_beyond_the_memory_available_is_refused():
    hf = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=2, hidden_size=64,
                         num_attention_heads=4)
    with pytest.raises(ValidationError, match=r"kv_cache_memory_gb=8 \(--kv-cache-memory\) "
                       r"is more than the 4.00 GB") as err:
        num_kv_blocks(hf, torch.float32, EngineConfig(kv_cache_memory_gb=8), 100,
                      available=4 * 2**30)
    assert err.value.parameter == "kv_cache_memory_gb"
    with pytest.raises(ValidationError, match="must be positive"):
        EngineConfig(kv_cache_memory_gb=0)


def test_generation_config_defaults_and_extra_eos_ids():
    gen = SimpleNamespace(eos_token_id=[2, 5], to_diff_dict=lambda: {
        "temperature": 0.6, "max_new_tokens": 64, "do_sample": True})
    assert generation_defaults(gen) == {"temperature": 0.6, "max_tokens": 64}
    assert generation_defaults(None) == {}
    assert extra_eos_ids(gen, 2) == {5}
    assert extra_eos_ids(SimpleNamespace(eos_token_id=9), 2) == {9}
    assert extra_eos_ids(None, 2) == set()
