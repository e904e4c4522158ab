"""`serve_in_kernel`: several servers on one engine, API keys, stopping frees the port."""

from __future__ import annotations

import socket

import httpx
import openai
import pytest

from tests.http.conftest import MODEL
from workbench import SamplingParams, serve_in_kernel

pytestmark = pytest.mark.slow


@pytest.fixture
def keyed_server(llm):
    handle = serve_in_kernel(llm, port=0, api_keys=("sekret",),
                             served_model_names=("smol", MODEL))
    yield handle
    handle.stop()


def test_api_key_protects_every_route_but_health_and_metrics(keyed_server):
    r = httpx.get(f"{keyed_server.base_url}/models")
    assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"})
    r = httpx.get(f"{keyed_server.base_url}/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    for path in ("/health", "/metrics"):
        assert httpx.get(keyed_server.url + path).status_code == 200
    assert httpx.get(keyed_server.url + "/version").status_code == 401
    assert httpx.post(keyed_server.url + "/tokenize", json={"prompt": "x"}).status_code == 401
    assert httpx.post(keyed_server.url + "/tokenize", json={"prompt": "x"},
                      headers={"Authorization": "Bearer sekret"}).status_code == 200


def test_api_key_accepted_and_aliases_served(keyed_server):
    client = openai.OpenAI(base_url=keyed_server.base_url, api_key="sekret", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["smol", MODEL]
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0)
    assert r.model == "smol"  # the first served name is reported, as vLLM
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_server.base_url, api_key="no", max_retries=0).models.list()


def test_servers_share_the_engine_but_not_their_metrics(server, keyed_server, llm):
    client = openai.OpenAI(base_url=keyed_server.base_url, api_key="sekret", max_retries=0)
    client.completions.create(model="smol", prompt="Hi", max_tokens=2)
    mine = httpx.get(keyed_server.url + "/metrics").text
    assert 'vllm:prompt_tokens_total{model_name="smol"}' in mine
    assert 'model_name="smol"' not in httpx.get(server.url + "/metrics").text
    # the notebook's own LLM keeps working while it is being served
    assert llm.generate("Hi", SamplingParams(max_tokens=2, temperature=0))[0].outputs[0].text


def test_stop_frees_the_port(llm):
    handle = serve_in_kernel(llm, port=0)
    port = handle.port
    assert httpx.get(handle.url + "/health").status_code == 200
    handle.stop()
    assert not handle.running
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))  # would raise if the server still held it


async def test_serving_from_inside_a_running_event_loop(llm):
    """As in Jupyter: the kernel's loop is running while the server starts and is queried."""
    handle = serve_in_kernel(llm, port=0)
    try:
        client = openai.AsyncOpenAI(base_url=handle.base_url, api_key="x", max_retries=0)
        r = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        assert r.usage.completion_tokens == 2
    finally:
        handle.stop()
