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
    """`make_server(engine={LLM kwargs}, **ServerConfig kwargs)` -> a running `KernelServer`."""
    from workbench import LLM, serve_in_kernel

    handles = []

    def make(engine: dict | None = None, **config):
        kwargs = {"max_model_len": MAX_MODEL_LEN, "block_size": 16, "num_kv_blocks": 256,
                  "max_num_seqs": 16, "seed": 0, **(engine or {})}
        llm = LLM(tiny_llama, **kwargs)
        handle = serve_in_kernel(llm, port=0, **config)
        handles.append(handle)
        return handle

    yield make
    for handle in handles:
        handle.stop(timeout=5)


@pytest.fixture
def slow_steps(monkeypatch):
    """`slow_steps(server, seconds)`: every model step of that server's engine takes longer."""
    import time

    def slow(server, seconds: float = 0.05):
        runner = server.engine.engine.runner
        real = runner.execute

        def execute(out):
            time.sleep(seconds)
            return real(out)

        monkeypatch.setattr(runner, "execute", execute)

    return slow
