"""Fixtures shared by every test folder: the real default model and a tiny random llama, and
the `Workbench` facade's two back ends over a module's own `llm` fixture.

The models are session-scoped and shared: treat them as read-only (build your own with
`load_model` / `tiny_model` to change weights). Tests never reach a model hub.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The Triton kernels' tests run them under Triton's interpreter
# (tests/engine/gpu/test_triton_kernels.py): triton reads this as it defines each kernel, and any
# test may import it first (transformers' GGUF loader imports torch._dynamo, which imports
# triton where it is installed). Nothing else in the suite runs Triton; a GPU run that wants
# compiled kernels sets TRITON_INTERPRET=0.
os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def default_model():
    """SmolLM2-135M-Instruct in float32 on the CPU (a `LoadedModel`), for tests comparing numbers."""
    from workbench.models import load_model

    return load_model("smollm2-135m-instruct", dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def tiny_llama():
    """A 2-layer random llama with the real SmolLM2 tokenizer, float32, seed 0 (a `LoadedModel`)."""
    from workbench.models import tiny_model

    return tiny_model("llama", seed=0, dtype="float32")


def pytest_collection_modifyitems(config, items):
    """Skip tests marked `gpu` on machines without a CUDA GPU, unless they are told to run on the
    CPU (`WORKBENCH_GPU_TESTS_ON_CPU=1`: scripts/gpu_check.py's dry run)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items or os.environ.get("WORKBENCH_GPU_TESTS_ON_CPU") == "1":
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def local(llm):
    """`Workbench(llm)` on the requesting module's `llm` (the in-kernel back end)."""
    from workbench import Workbench

    with Workbench(llm) as wb:
        yield wb


@pytest.fixture(scope="module")
def remote(llm):
    """`Workbench(url=...)` against `llm` served in the kernel over HTTP."""
    from workbench import Workbench, serve_in_kernel

    with serve_in_kernel(llm, port=0) as server, Workbench(url=server.base_url,
                                                          api_key="unused") as wb:
        yield wb


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """`tiny_llama`'s weights and tokenizer saved as a model directory (what `LLM(model=...)`,
    the CLI and Ray replicas load), from a fresh copy: an engine built on the shared fixture
    takes its projections over, and it can no longer be saved."""
    from workbench.models import tiny_model

    path = tmp_path_factory.mktemp("tiny-llama")
    fresh = tiny_model("llama", seed=0, dtype="float32")
    fresh.model.save_pretrained(path)
    fresh.tokenizer.save_pretrained(path)
    return path


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
