"""LiteLLM's common calls, unmodified, against an in-process server (`openai/<name>` with
`api_base`): completion, streaming, async, tools, JSON-schema response format, OpenAI fields it
forwards (`metadata` stays LiteLLM's own; `store`, `service_tier` reach the server), legacy
text completion and embeddings.
"""

from __future__ import annotations

import json

import pytest

from tests.clients.conftest import EMBED_MODEL, MODEL

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "What is the capital of France? One word."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def litellm():
    import litellm

    litellm.telemetry = False
    return litellm


@pytest.fixture
def kw(server):
    return {"model": f"openai/{MODEL}", "api_base": server.base_url, "api_key": "unused",
            "num_retries": 0, "timeout": 120}


def test_completion(litellm, kw):
    r = litellm.completion(messages=ASK, max_tokens=8, temperature=0, **kw)
    assert r.choices[0].message.content
    assert r.usage.completion_tokens > 0


def test_completion_with_openai_fields(litellm, kw):
    r = litellm.completion(messages=ASK, max_tokens=4, store=True, service_tier="auto",
                           prompt_cache_key="k", safety_identifier="user-1", **kw)
    assert r.choices[0].message.content is not None


def test_stream(litellm, kw):
    chunks = list(litellm.completion(messages=ASK, max_tokens=8, stream=True,
                                     stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


async def test_acompletion(litellm, kw):
    r = await litellm.acompletion(messages=ASK, max_tokens=4, **kw)
    assert r.choices[0].message.content


def test_tools_required(litellm, kw):
    r = litellm.completion(messages=[{"role": "user", "content": "Weather in Rome?"}],
                           tools=[WEATHER], tool_choice="required", max_tokens=60,
                           temperature=0, **kw)
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert "city" in json.loads(call.function.arguments)


def test_json_schema_response_format(litellm, kw):
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    r = litellm.completion(
        messages=[{"role": "user", "content": "Name a city in Italy as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        max_tokens=60, temperature=0, **kw)
    assert "city" in json.loads(r.choices[0].message.content)


def test_text_completion(litellm, kw):
    r = litellm.text_completion(prompt="Once upon a time", max_tokens=5, **kw)
    assert r.choices[0].text


def test_embedding(litellm, embed_server):
    r = litellm.embedding(model=f"openai/{EMBED_MODEL}", input=["a cat", "a dog"],
                          api_base=embed_server.base_url, api_key="unused")
    assert len(r.data) == 2 and len(r.data[0]["embedding"]) == 384
