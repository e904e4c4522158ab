"""`/v1/models`, `/tokenize`, `/detokenize`, `/health`, `/version`, `/metrics`, `/docs`."""

from __future__ import annotations

import pytest

import workbench
from tests.http.conftest import MAX_MODEL_LEN, MODEL

pytestmark = pytest.mark.slow


def test_models_list(client):
    models = client.models.list()
    card = models.data[0]
    assert [m.id for m in models.data] == [MODEL]
    assert card.object == "model" and card.model_extra["max_model_len"] == MAX_MODEL_LEN
    assert card.model_extra["arithmetic"] == {"dtype": "float32", "batch_invariant": False}
    assert card.model_extra["permission"][0]["object"] == "model_permission"


def test_tokenize_prompt_with_token_strings(http):
    r = http.post("/tokenize", json={"model": MODEL, "prompt": "Hello world",
                                     "return_token_strs": True}).json()
    assert r == {"count": 2, "max_model_len": MAX_MODEL_LEN, "tokens": [19556, 905],
                 "token_strs": ["Hello", "Ġworld"]}


def test_tokenize_messages_uses_the_chat_template(http, llm):
    messages = [{"role": "user", "content": "Hi"}]
    r = http.post("/tokenize", json={"messages": messages}).json()
    text = llm.get_tokenizer().apply_chat_template(messages, tokenize=False,
                                                   add_generation_prompt=True)
    assert r["tokens"] == llm.get_tokenizer()(text, add_special_tokens=False).input_ids
    assert r["token_strs"] is None


def test_tokenize_does_not_enforce_the_context(http):
    r = http.post("/tokenize", json={"prompt": "a " * (MAX_MODEL_LEN + 5)}).json()
    assert r["count"] > MAX_MODEL_LEN


def test_detokenize_round_trip(http):
    assert http.post("/detokenize", json={"tokens": [19556, 905]}).json() == {"prompt": "Hello world"}
    r = http.post("/detokenize", json={"model": "other", "tokens": [1]})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_health_and_version(http):
    r = http.get("/health")
    assert (r.status_code, r.content) == (200, b"")
    assert http.get("/version").json() == {"version": workbench.__version__}


def test_metrics_count_requests_tokens_and_latency(client, http):
    client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, temperature=0)
    text = http.get("/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "http_requests_total"):
        assert name in text
    assert f'vllm:request_success_total{{finished_reason="length",model_name="{MODEL}"}}' in text


def test_metrics_count_prefix_cache_hits(client, http):
    def hits() -> float:
        for line in http.get("/metrics").text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError("no vllm:prefix_cache_hits_total")

    prompt = "A prompt long enough to fill a few cache blocks of sixteen tokens each. " * 3
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
    before = hits()
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
    assert hits() >= before + 16  # the second run found at least one full block cached


def test_docs_page_is_self_contained(http):
    page = http.get("/docs").text
    assert "/v1/chat/completions" in page and "ChatCompletionRequest" in page
    assert "<script" not in page and "cdn" not in page.lower()
    assert "/v1/completions" in http.get("/openapi.json").json()["paths"]
