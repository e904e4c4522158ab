"""Adapters for the LoRA tests: random peft adapters on the tiny llama, made once per session."""

from __future__ import annotations

import pytest

from tests.lora.helpers import make_adapter


@pytest.fixture(scope="session")
def adapters(tmp_path_factory):
    """Two random adapters of the tiny llama: `a` (q, v; rank 4) and `b` (every projection;
    rank 8), plus `big` (rank 32)."""
    root = tmp_path_factory.mktemp("loras")
    return {
        "a": make_adapter(root / "a", seed=1, base_model="tiny-llama"),
        "b": make_adapter(root / "b", seed=2, rank=8, base_model="tiny-llama",
                          targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                   "up_proj", "down_proj")),
        "big": make_adapter(root / "big", seed=3, rank=32),
    }
