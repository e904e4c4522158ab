"""A live server on the real default model, shared by the HTTP tests of a session.

`serve_in_kernel` runs uvicorn in a background thread on a free port, over an `LLM` built on
the session's float32 SmolLM2 with a small context (512), so context-length errors are cheap.
"""

from __future__ import annotations

import pytest

MODEL = "smollm2-135m-instruct"
MAX_MODEL_LEN = 512


@pytest.fixture(scope="session")
def llm(default_model):
    from workbench import LLM

    return LLM(model=default_model, max_model_len=MAX_MODEL_LEN, seed=0)


@pytest.fixture(scope="session")
def server(llm):
    from workbench import serve_in_kernel

    handle = serve_in_kernel(llm, port=0)
    yield handle
    handle.stop()


@pytest.fixture
def client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def aclient(server):
    import openai

    return openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                              timeout=120)


@pytest.fixture
def http(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def tiny_llm(tiny_llama):
    """An `LLM` on the tiny llama (fast; its text is noise), one per test module that asks."""
    from workbench import LLM

    return LLM(tiny_llama, max_model_len=128, block_size=16, num_kv_blocks=64, seed=0)


@pytest.fixture(scope="module")
def tiny_server_flags():
    """`ServerConfig` keywords of `tiny_server`; a module overrides this fixture for its own."""
    return {}


@pytest.fixture(scope="module")
def tiny_server(tiny_llm, tiny_server_flags):
    """A server on `tiny_llm` with `tiny_server_flags`, one per test module that asks."""
    from workbench import serve_in_kernel

    handle = serve_in_kernel(tiny_llm, port=0, **tiny_server_flags)
    yield handle
    handle.stop(timeout=5)


@pytest.fixture
def tiny_http(tiny_server):
    import httpx

    with httpx.Client(base_url=tiny_server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def tiny_model_name(tiny_llama):
    """The name `tiny_server` serves `tiny_llm` under."""
    return tiny_llama.served_name


@pytest.fixture
def tiny_sdk(tiny_server):
    """The official `openai` client on `tiny_server` (no retries: a failure shows at once)."""
    import openai

    return openai.OpenAI(base_url=tiny_server.base_url, api_key="unused", max_retries=0,
                         timeout=60)
