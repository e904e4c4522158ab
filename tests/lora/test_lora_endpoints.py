"""Issue 16 item 8: a served adapter's name works on `/v1/responses` and the pooling endpoints as
on chat (vLLM accepts a served LoRA name on every endpoint and runs it); a name neither served
nor an adapter is the reference's 404, whose message keeps vLLM 0.32's "Valid aliases" list."""

from __future__ import annotations

import httpx
import pytest

from tests.lora.helpers import fresh_tiny
from workbench import LLM, serve_in_kernel

BASE = "tiny-llama"


@pytest.fixture(scope="module")
def server(adapters):
    llm = LLM(fresh_tiny(), enable_lora=True, max_loras=2, dtype="float32", num_kv_blocks=64,
              max_model_len=256)
    handle = serve_in_kernel(llm, lora_modules=(f"b={adapters['b']}",))
    yield handle
    handle.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def _chat(http, model):
    r = http.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": 6, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _respond(http, model):
    r = http.post("/v1/responses", json={"model": model, "input": "Hello there",
                                         "max_output_tokens": 6, "temperature": 0,
                                         "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()


def test_responses_run_a_served_adapter(http):
    with_adapter, base = _respond(http, "b"), _respond(http, BASE)
    assert with_adapter["model"] == "b" and base["model"] == BASE
    assert with_adapter["output"][0]["content"][0]["text"] == _chat(http, "b")
    assert base["output"][0]["content"][0]["text"] == _chat(http, BASE)
    assert _chat(http, "b") != _chat(http, BASE)


def test_unknown_model_is_vllms_404(http):
    r = http.post("/v1/responses", json={"model": "nope", "input": "hi"})
    assert r.status_code == 404
    assert r.json()["error"]["message"] == (
        "The model `nope` does not exist. Valid aliases: tiny-llama.")


@pytest.mark.parametrize("route, body, values", [
    ("/v1/embeddings", {"input": ["Hello there", "A pirate ship"]},
     lambda j: [d["embedding"] for d in j["data"]]),
    ("/classify", {"input": ["Hello there"]}, lambda j: [d["probs"] for d in j["data"]]),
    ("/score", {"queries": "Hello there", "documents": ["hi", "bye"]},
     lambda j: [d["score"] for d in j["data"]]),
])
def test_pooling_endpoints_run_a_served_adapter(http, route, body, values):
    with_adapter = http.post(route, json={"model": "b", **body})
    base = http.post(route, json={"model": BASE, **body})
    assert with_adapter.status_code == 200 and base.status_code == 200, with_adapter.text
    assert with_adapter.json()["model"] == "b" and base.json()["model"] == BASE
    flat = lambda j: [x for v in values(j) for x in (v if isinstance(v, list) else [v])]
    ours, theirs = flat(with_adapter.json()), flat(base.json())
    assert max(abs(a - b) for a, b in zip(ours, theirs)) > 1e-3  # the adapter's weights applied
    again = flat(http.post(route, json={"model": "b", **body}).json())  # prefix-cache hits:
    assert again == pytest.approx(ours, rel=1e-4, abs=1e-5)  # the same up to float noise
    assert http.post(route, json={"model": "nope", **body}).status_code == 404
