"""`use_beam_search` on /v1/completions and /v1/chat/completions, with the official client."""

from __future__ import annotations

import openai
import pytest

from workbench.sampling_params import BeamSearchParams


def test_completion_choices_are_the_engine_beams_best_first(client, llm):
    resp = client.completions.create(
        model="smollm2-135m-instruct", prompt="The capital of France is", n=3, max_tokens=5,
        extra_body={"use_beam_search": True, "length_penalty": 0.5, "return_token_ids": True})
    expected = llm.beam_search("The capital of France is", BeamSearchParams(
        beam_width=3, max_tokens=5, length_penalty=0.5))[0]
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert [c.text for c in resp.choices] == [s.text for s in expected.sequences]
    n = len(expected.prompt_token_ids)
    assert [c.token_ids for c in resp.choices] == [s.tokens[n:] for s in expected.sequences]
    assert resp.usage.completion_tokens == sum(len(s.tokens) - n for s in expected.sequences)


def test_completion_logprobs_are_each_steps_candidates(client):
    resp = client.completions.create(
        model="smollm2-135m-instruct", prompt="Hello", n=2, max_tokens=3, logprobs=4,
        extra_body={"use_beam_search": True, "ignore_eos": True})
    for choice in resp.choices:
        assert len(choice.logprobs.tokens) == 3
        assert all(lp is not None and lp <= 0 for lp in choice.logprobs.token_logprobs)


def test_completion_stream_with_beam_search_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="smollm2-135m-instruct", prompt="Hi", n=2, max_tokens=3,
                                  stream=True, extra_body={"use_beam_search": True})
    assert "Streaming is not currently supported with beam search" in str(err.value)


def test_chat_beam_search(client, llm):
    messages = [{"role": "user", "content": "Reply with one word: yes or no?"}]
    resp = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=messages, n=2, max_tokens=6,
        extra_body={"use_beam_search": True})
    expected = llm.beam_search(_chat_prompt(llm, messages),
                               BeamSearchParams(beam_width=2, max_tokens=6))[0]
    assert [c.message.content for c in resp.choices] == [s.text for s in expected.sequences]
    assert [c.finish_reason for c in resp.choices] == [
        s.finish_reason for s in expected.sequences]


def _chat_prompt(llm, messages):
    tok = llm.get_tokenizer()
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return {"prompt_token_ids": tok(text, add_special_tokens=False)["input_ids"]}


def test_chat_stream_with_beam_search_sends_the_whole_result(client):
    messages = [{"role": "user", "content": "Say hi"}]
    chunks = list(client.chat.completions.create(
        model="smollm2-135m-instruct", messages=messages, n=2, max_tokens=4, stream=True,
        extra_body={"use_beam_search": True}))
    text = {0: "", 1: ""}
    for chunk in chunks:
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
    plain = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=messages, n=2, max_tokens=4,
        extra_body={"use_beam_search": True})
    assert [text[0], text[1]] == [c.message.content for c in plain.choices]
