"""`/v1/chat/completions` through the official `openai` client against a live server."""

from __future__ import annotations

import pytest

from tests.http.conftest import MODEL

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Hi"}]


def test_sync_chat(client):
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=6, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6


async def test_async_chat(aclient, client):
    sync = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=6, temperature=0)
    r = await aclient.chat.completions.create(model=MODEL, messages=HI, max_tokens=6,
                                              temperature=0)
    assert r.choices[0].message.content == sync.choices[0].message.content


def test_streamed_text_equals_non_streamed_at_temperature_0(client):
    whole = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_streamed_logprobs_equal_the_non_streamed_ones(client):
    kwargs = dict(model=MODEL, messages=HI, max_tokens=4, temperature=0, logprobs=True,
                  top_logprobs=2)
    # the prompt in the prefix cache for both (else the first prefills it whole and the second
    # reads it from the cache: other bits in the last places without batch_invariant=True)
    client.chat.completions.create(**kwargs)
    whole = client.chat.completions.create(**kwargs).choices[0].logprobs.content
    streamed = [e for c in client.chat.completions.create(**kwargs, stream=True)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole]
    assert [[t.token for t in e.top_logprobs] for e in streamed] == \
        [[t.token for t in e.top_logprobs] for e in whole]


async def test_async_stream(aclient):
    stream = await aclient.chat.completions.create(model=MODEL, messages=HI, max_tokens=4,
                                                   temperature=0, stream=True)
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_logprobs_content_with_top_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3, temperature=0,
                                       logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert "".join(c.token for c in content) == r.choices[0].message.content
    for entry in content:
        assert entry.bytes == list(entry.token.encode())
        assert len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].token == entry.token  # greedy: the sampled token is best


def test_max_completion_tokens_wins_over_max_tokens(client):
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2,
                                       max_completion_tokens=4, temperature=0)
    assert r.usage.completion_tokens == 4


def test_continue_final_message_and_echo(client):
    messages = HI + [{"role": "assistant", "content": "Hello! My name"}]
    r = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0,
        extra_body={"add_generation_prompt": False, "continue_final_message": True,
                    "echo": True, "return_prompt_text": True})
    assert r.choices[0].message.content.startswith("Hello! My name")
    assert r.model_extra["prompt_text"].endswith("<|im_start|>assistant\nHello! My name")


def test_system_developer_and_content_parts(client):
    messages = [{"role": "developer", "content": "Answer in one word."},
                {"role": "user", "content": [{"type": "text", "text": "Capital"},
                                             {"type": "text", "text": "of France?"}]}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3,
                                       temperature=0, extra_body={"return_prompt_text": True})
    assert "<|im_start|>system\nAnswer in one word.<|im_end|>" in r.model_extra["prompt_text"]
    assert "Capital\nof France?" in r.model_extra["prompt_text"]


def test_n_choices_stream_each_open_with_a_role(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3, n=2,
                                                 temperature=1.0, seed=1, stream=True))
    roles = [c.choices[0].index for c in chunks if c.choices[0].delta.role == "assistant"]
    assert roles == [0, 1]
    finished = {c.choices[0].index for c in chunks if c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_logprobs_without_top_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2, temperature=0,
                                       logprobs=True)
    content = r.choices[0].logprobs.content
    assert len(content) == 2 and all(c.top_logprobs == [] and c.logprob <= 0 for c in content)


def test_system_fingerprint_only_in_the_response_and_the_last_chunk(client):
    kwargs = dict(model=MODEL, messages=HI, max_tokens=2, temperature=0)
    fp = client.chat.completions.create(**kwargs).system_fingerprint
    assert fp.startswith("workbench-")
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    assert [c.system_fingerprint for c in chunks] == [None] * (len(chunks) - 1) + [fp]
