"""Fixtures for the engine tests: the tiny qwen2 and mistral models and the shared tokenizer.

The real SmolLM2 (`default_model`) and the tiny llama (`tiny_llama`) come from tests/conftest.py;
helper functions live in `tests/engine/helpers.py`.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_qwen2():
    from workbench.models import tiny_model

    return tiny_model("qwen2", seed=0, dtype="float32")


@pytest.fixture(scope="session")
def tiny_mistral():
    from workbench.models import tiny_model

    return tiny_model("mistral", seed=0, dtype="float32")


@pytest.fixture(scope="session")
def tokenizer(tiny_llama):
    """The real SmolLM2 tokenizer (the tiny models share it)."""
    return tiny_llama.tokenizer


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Engine tests run torch on one thread, restored afterwards.

    The models here are small and the machines have two shared cores: with two OpenMP threads,
    any other load on the machine makes each step several times slower (threads wait on each
    other at every op), while one thread keeps steady. Timing belongs to `workbench bench`.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
