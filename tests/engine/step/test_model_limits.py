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


def test_generation_config_defaults_and_extra_eos_ids():
    gen = SimpleNamespace(eos_token_id=[2, 5], to_diff_dict=lambda: {
        "temperature": 0.6, "max_new_tokens": 64, "do_sample": True})
    assert generation_defaults(gen) == {"temperature": 0.6, "max_tokens": 64}
    assert generation_defaults(None) == {}
    assert extra_eos_ids(gen, 2) == {5}
    assert extra_eos_ids(SimpleNamespace(eos_token_id=9), 2) == {9}
    assert extra_eos_ids(None, 2) == set()
