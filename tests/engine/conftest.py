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
