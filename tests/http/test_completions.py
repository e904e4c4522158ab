"""`/v1/completions` through the official `openai` client against a live server."""

from __future__ import annotations

import pytest

from tests.http.conftest import MODEL

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time"


def test_sync_completion(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == MODEL
    assert r.choices[0].finish_reason == "length" and r.choices[0].text
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (4, 6, 10)


async def test_async_completion_matches_sync(client, aclient):
    sync = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    r = await aclient.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    assert r.choices[0].text == sync.choices[0].text


def test_streamed_text_equals_non_streamed_at_temperature_0(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8


async def test_async_stream(aclient):
    stream = await aclient.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4,
                                              temperature=0, stream=True)
    texts = [c.choices[0].text async for c in stream]
    assert len(texts) == 4


def test_batch_of_prompts(client):
    r = client.completions.create(model=MODEL, prompt=[PROMPT, "Hello world"], max_tokens=3,
                                  temperature=0)
    single = client.completions.create(model=MODEL, prompt="Hello world", max_tokens=3,
                                       temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[1].text == single.choices[0].text
    assert r.usage.prompt_tokens == 4 + 2


def test_token_id_prompts_and_return_token_ids(client):
    r = client.completions.create(model=MODEL, prompt=[[19556, 905], [19556]], max_tokens=3,
                                  temperature=0, extra_body={"return_token_ids": True})
    assert r.choices[0].model_extra["prompt_token_ids"] == [19556, 905]
    assert r.choices[1].model_extra["prompt_token_ids"] == [19556]
    assert len(r.choices[0].model_extra["token_ids"]) == 3


def test_n_samples_with_seed_are_reproducible(client):
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=5, n=2, temperature=1.0, seed=7)
    first, second = client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.text for c in first.choices] == [c.text for c in second.choices]


def test_logprobs_legacy_format(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0 and lp.text_offset[1] == len(lp.tokens[0])
    assert all(1 <= len(top) <= 3 for top in lp.top_logprobs)
    assert lp.top_logprobs[0][lp.tokens[0]] == lp.token_logprobs[0]


def test_streamed_logprobs_equal_the_non_streamed_ones(client):
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
    whole = client.completions.create(**kwargs).choices[0].logprobs
    chunks = [c.choices[0].logprobs for c in client.completions.create(**kwargs, stream=True)
              if c.choices]
    assert [t for lp in chunks for t in lp.tokens] == whole.tokens
    assert [x for lp in chunks for x in lp.token_logprobs] == whole.token_logprobs
    assert [x for lp in chunks for x in lp.text_offset] == whole.text_offset
    assert [x for lp in chunks for x in lp.top_logprobs] == whole.top_logprobs


def test_echo_with_logprobs_scores_the_prompt(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True,
                                  logprobs=1)
    choice = r.choices[0]
    assert choice.text == PROMPT
    assert choice.logprobs.token_logprobs[0] is None
    assert all(x < 0 for x in choice.logprobs.token_logprobs[1:])
    assert r.usage.completion_tokens == 0


def test_stop_string_sets_stop_reason(client):
    base = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    word = base.choices[0].text.split()[2]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                  stop=[word])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == word
    assert word not in r.choices[0].text


def test_continuous_usage_stats(client):
    chunks = list(client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert [c.usage.completion_tokens for c in chunks] == [1, 2, 3, 3]


def test_system_fingerprint_in_the_response_and_the_last_chunk(client):
    kwargs = dict(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0)
    fp = client.completions.create(**kwargs).system_fingerprint
    assert fp.startswith("workbench-") and len(fp.rsplit("-", 1)[1]) == 8
    chunks = [c for c in client.completions.create(**kwargs, stream=True)]
    assert chunks[-1].system_fingerprint == fp
    assert all(c.system_fingerprint is None for c in chunks[:-1])
    with_usage = list(client.completions.create(**kwargs, stream=True,
                                                stream_options={"include_usage": True}))
    assert with_usage[-1].usage is not None and with_usage[-1].system_fingerprint == fp
