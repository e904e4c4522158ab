"""The official `openai` SDK's common calls, unmodified, against an in-process server.

Each call is what a user writes first: chat (plain, streamed with usage, with OpenAI's own
fields such as `store`, `metadata`, `service_tier`), `parse` into a pydantic model, tools
(`required`, named, `strict`), legacy completions, models, embeddings, the Responses API.
"""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel

from tests.clients.conftest import EMBED_MODEL, MODEL

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}


class City(BaseModel):
    name: str
    country: str


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def test_chat(client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.usage.completion_tokens == 8 or r.choices[0].finish_reason == "stop"


def test_chat_with_openais_own_fields(client):
    """What SDKs and frameworks send: all accepted (no effect here), none a 400."""
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, max_completion_tokens=4, store=True,
        metadata={"app": "tests"}, service_tier="auto", prompt_cache_key="k",
        safety_identifier="user-1", verbosity="low", modalities=["text"], user="u")
    assert r.choices[0].message.content is not None


def test_chat_stream_with_usage(client):
    stream = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=6, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_chat_stream_helper(client):
    with client.chat.completions.stream(model=MODEL, messages=ASK, max_tokens=100,
                                        temperature=0) as stream:
        final = stream.get_final_completion()  # the helper refuses a `length` finish
    assert "Paris" in final.choices[0].message.content


def test_parse_into_a_pydantic_model(client):
    r = client.chat.completions.parse(
        model=MODEL, max_tokens=60, temperature=0, response_format=City,
        messages=[{"role": "user", "content": "Name a city in Italy as JSON."}])
    city = r.choices[0].message.parsed
    assert isinstance(city, City) and city.name


def test_required_tool_call(client):
    r = client.chat.completions.create(
        model=MODEL, max_tokens=60, temperature=0, tools=[WEATHER], tool_choice="required",
        messages=[{"role": "user", "content": "Weather in Rome?"}])
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}


def test_named_tool_call_with_parse(client):
    r = client.chat.completions.parse(
        model=MODEL, max_tokens=60, temperature=0,
        tools=[openai.pydantic_function_tool(City, name="report_city")],
        tool_choice={"type": "function", "function": {"name": "report_city"}},
        messages=[{"role": "user", "content": "Which city is the Eiffel Tower in?"}])
    call = r.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, City)


def test_legacy_completion(client):
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5,
                                  logprobs=2, seed=3)
    assert r.choices[0].text and len(r.choices[0].logprobs.tokens) == 5


def test_models_list(client):
    ids = [m.id for m in client.models.list().data]
    assert MODEL in ids


def test_embeddings(embed_server):
    client = openai.OpenAI(base_url=embed_server.base_url, api_key="unused", max_retries=0)
    r = client.embeddings.create(model=EMBED_MODEL, input=["a cat", "a dog"])  # base64 default
    assert len(r.data) == 2 and len(r.data[0].embedding) == 384


def test_responses(client):
    r = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=8,
                                store=False, metadata={"app": "tests"},
                                prompt_cache_key="k", safety_identifier="user-1")
    assert r.output_text
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)  # store=False: nothing kept


def test_responses_stream(client):
    with client.responses.stream(model=MODEL, input="Say hello.", max_output_tokens=8) as s:
        final = s.get_final_response()
    assert final.status in ("completed", "incomplete") and final.output_text


def test_a_typo_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=2,
                                       extra_body={"temprature": 0.5})
    assert err.value.body["param"] == "temprature"
