"""LangChain's `ChatOpenAI` (langchain-openai), unmodified, against an in-process server:
invoke, stream (with usage), batch, async, tools (`bind_tools`), structured output (JSON
schema and function calling), OpenAI's fields it forwards (`store`, `service_tier`,
`verbosity`), the Responses API path, and `OpenAIEmbeddings`.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from tests.clients.conftest import EMBED_MODEL, MODEL

pytestmark = pytest.mark.slow


class City(BaseModel):
    """A city and its country."""

    name: str = Field(description="the city")
    country: str = Field(description="its country")


def get_weather(city: str) -> str:
    """Current weather in a city."""
    return "sunny"


@pytest.fixture
def chat(server):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=MODEL, base_url=server.base_url, api_key="unused", max_retries=0,
                      temperature=0, max_tokens=60, timeout=120)


def test_invoke(chat):
    message = chat.invoke("What is the capital of France? One word.")
    assert message.content
    assert message.usage_metadata["output_tokens"] > 0


def test_openai_fields_langchain_forwards(server):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model=MODEL, base_url=server.base_url, api_key="unused", max_retries=0,
                      max_tokens=4, store=True, service_tier="auto", verbosity="low",
                      model_kwargs={"prompt_cache_key": "k", "safety_identifier": "user-1"})
    assert chat.invoke("Hi").content is not None


def test_stream_with_usage(chat):
    chunks = list(chat.bind(stream_usage=True).stream("Say hello."))
    assert "".join(c.content for c in chunks)
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    assert total.usage_metadata["output_tokens"] > 0  # stream_options.include_usage sent


def test_batch(chat):
    answers = chat.batch(["Say hi.", "Say bye."])
    assert len(answers) == 2 and all(a.content for a in answers)


async def test_ainvoke(chat):
    message = await chat.ainvoke("Say hi.")
    assert message.content


def test_bind_tools_required(chat):
    message = chat.bind_tools([get_weather], tool_choice="required").invoke("Weather in Rome?")
    assert message.tool_calls[0]["name"] == "get_weather"
    assert set(message.tool_calls[0]["args"]) == {"city"}


def test_bind_tools_named(chat):
    message = chat.bind_tools([get_weather], tool_choice="get_weather").invoke("Rome?")
    assert message.tool_calls[0]["name"] == "get_weather"


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output(chat, method):
    city = chat.with_structured_output(City, method=method).invoke(
        "Name a city in Italy and its country.")
    assert isinstance(city, City) and city.name


def test_responses_api(server):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model=MODEL, base_url=server.base_url, api_key="unused", max_retries=0,
                      max_tokens=8, use_responses_api=True)
    message = chat.invoke("Say hello.")
    assert message.text


def test_embeddings(embed_server):
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length would fetch tiktoken's encoding from the network
    embeddings = OpenAIEmbeddings(model=EMBED_MODEL, base_url=embed_server.base_url,
                                  api_key="unused", check_embedding_ctx_length=False,
                                  max_retries=0)
    vectors = embeddings.embed_documents(["a cat", "a dog"])
    assert len(vectors) == 2 and len(vectors[0]) == 384
    assert len(embeddings.embed_query("a bird")) == 384
