"""Fixtures for the engine tests: one torch thread.

The models (the real SmolLM2, the tiny llama, qwen2 and mistral, the shared tokenizer) come from
tests/conftest.py;
helper functions live in `tests/engine/helpers.py`.
"""

from __future__ import annotations

import pytest


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
