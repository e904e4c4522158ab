"""A live server on the tiny random llama, for the reliability tests (fast: 2 layers).

Each test module gets its own server (`serve_in_kernel` on a free port) with the limits it
needs; `make_server(**server_config)` builds more. The KV cache is small and explicit so
block accounting is easy to check.
"""

from __future__ import annotations

import pytest

MAX_MODEL_LEN = 128


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def make_server(tiny_llama):
    """`make_server(**ServerConfig kwargs)` -> a running `KernelServer` on its own engine."""
    from workbench import LLM, serve_in_kernel

    handles = []

    def make(**config):
        llm = LLM(tiny_llama, max_model_len=MAX_MODEL_LEN, block_size=16, num_kv_blocks=256,
                  max_num_seqs=16, seed=0)
        handle = serve_in_kernel(llm, port=0, **config)
        handles.append(handle)
        return handle

    yield make
    for handle in handles:
        handle.stop(timeout=5)
