"""`token_stats` over HTTP (the `openai` SDK's `extra_body`): each choice's logprobs carry the
engine's `TokenStats` as a workbench extra key, equal to the offline `LLM.generate`'s, prompt
positions beside `prompt_logprobs`; absent unless asked; refusals are 400s naming the field;
the validation report lists it. On the tiny llama."""

from __future__ import annotations

import json

import pytest

from workbench.sampling_params import SamplingParams

PROMPT = "The capital of France is"
MSG = [{"role": "user", "content": "hi"}]


def _offline(tiny_llm, prompt, **params):
    return tiny_llm.generate(prompt, SamplingParams(temperature=0, token_stats=True, **params))[0]


def test_completions_carry_the_engines_numbers(tiny_sdk, tiny_llm, tiny_model_name):
    r = tiny_sdk.completions.create(model=tiny_model_name, prompt=PROMPT, max_tokens=4,
                                    temperature=0, logprobs=2, extra_body={"token_stats": True})
    stats = r.choices[0].logprobs.model_extra["token_stats"]
    offline = _offline(tiny_llm, PROMPT, max_tokens=4, logprobs=2)
    assert stats == [s.to_json() for s in offline.outputs[0].token_stats]
    assert len(stats) == len(r.choices[0].logprobs.tokens) == 4
    assert set(stats[0]) == {"entropy", "rank", "margin", "top_k_mass"}


def test_chat_carries_them_and_k_does_not_change_them(tiny_sdk, tiny_model_name):
    runs = [tiny_sdk.chat.completions.create(model=tiny_model_name, messages=MSG, max_tokens=4,
                                             temperature=0, logprobs=True, top_logprobs=k,
                                             extra_body={"token_stats": True})
            for k in (0, 5)]
    few, many = (r.choices[0].logprobs.model_extra["token_stats"] for r in runs)
    assert len(few) == len(runs[0].choices[0].logprobs.content)
    for a, b in zip(few, many):  # the second reads the first's prompt from the prefix cache:
        assert a["rank"] == b["rank"]  # float32 rounding apart, the same numbers
        assert (a["entropy"], a["margin"]) == pytest.approx((b["entropy"], b["margin"]), abs=1e-5)
        assert a["top_k_mass"] == 0.0 < b["top_k_mass"]


def test_prompt_positions_and_echo(tiny_http, tiny_llm):
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0, "logprobs": 1, "echo": True,
            "token_stats": True}
    choice = tiny_http.post("/v1/completions", json=body).json()["choices"][0]
    offline = _offline(tiny_llm, PROMPT, max_tokens=2, logprobs=1, prompt_logprobs=1)
    prompt = [None] + [s.to_json() for s in offline.prompt_token_stats[1:]]
    assert choice["prompt_token_stats"] == prompt
    assert choice["logprobs"]["token_stats"] == prompt + [
        s.to_json() for s in offline.outputs[0].token_stats]
    chat = tiny_http.post("/v1/chat/completions", json={
        "messages": MSG, "max_tokens": 2, "prompt_logprobs": 0, "token_stats": True}).json()
    assert chat["prompt_token_stats"][0] is None and len(chat["prompt_token_stats"]) > 1
    assert chat["choices"][0]["logprobs"] is None  # no logprobs asked: no generated stats


def test_streamed_pieces_add_up_to_the_whole(tiny_http):
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 1,
            "token_stats": True}
    whole = tiny_http.post("/v1/completions", json=body).json()["choices"][0]
    with tiny_http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    streamed = [s for e in events for c in e["choices"] if c.get("logprobs")
                for s in c["logprobs"]["token_stats"]]
    assert streamed == whole["logprobs"]["token_stats"]


def test_a_request_without_it_is_unchanged(tiny_http):
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": 2, "echo": True,
            "prompt_logprobs": 1}
    plain = tiny_http.post("/v1/completions", json=body).json()
    off = tiny_http.post("/v1/completions", json={**body, "token_stats": False}).json()
    for r in (plain, off):
        choice = r["choices"][0]
        assert "token_stats" not in choice["logprobs"] and "prompt_token_stats" not in choice
    assert plain["choices"][0] == off["choices"][0]
    chat = tiny_http.post("/v1/chat/completions", json={
        "messages": MSG, "max_tokens": 2, "logprobs": True, "prompt_logprobs": 0}).json()
    assert "token_stats" not in chat["choices"][0]["logprobs"]
    assert "prompt_token_stats" not in chat


@pytest.mark.parametrize("path, body, words", [
    ("/v1/completions", {"prompt": PROMPT}, "logprobs"),
    ("/v1/chat/completions", {"messages": MSG}, "logprobs"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": 1, "use_beam_search": True, "n": 2},
     "beam search"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": 1, "token_stats": "maybe"}, "token_stats"),
])
def test_bad_requests_name_the_field(tiny_http, path, body, words):
    r = tiny_http.post(path, json={"token_stats": True, "max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]  # a schema error names the body's field: body.token_stats
    assert error["param"] in ("token_stats", "body.token_stats") and words in error["message"]


@pytest.mark.parametrize("path, body", [
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
    ("/v1/embeddings", {"input": "hi"}),
])
def test_other_endpoints_refuse_it_by_name(tiny_http, path, body):
    r = tiny_http.post(path, json={**body, "token_stats": True})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "token_stats"
    assert "/v1/completions and /v1/chat/completions" in r.json()["error"]["message"]


def test_the_validation_report_lists_where_it_applies(tiny_http):
    body = {"prompt": PROMPT, "max_tokens": 2, "logprobs": 1, "prompt_logprobs": 1,
            "token_stats": True}
    report = tiny_http.post("/v1/validate", json=body).json()
    assert report["ok"], report
    rows = [c for c in report["checks"] if c["name"] == "token_stats"]
    assert len(rows) == 1 and rows[0]["status"] == "passed"
    assert rows[0]["stage"] == "sampling params"
    assert "generated" in rows[0]["reason"] and "prompt" in rows[0]["reason"]


def test_chat_streams_them_with_their_tokens_even_held_back(tiny_http):
    body = {"messages": MSG, "max_tokens": 6, "temperature": 0, "logprobs": True,
            "top_logprobs": 1, "token_stats": True}
    whole = tiny_http.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]
    for extra in ({}, {"stream_options": {"min_characters": 5}}):
        with tiny_http.stream("POST", "/v1/chat/completions",
                              json={**body, **extra, "stream": True}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        pieces = [c["logprobs"] for e in events for c in e["choices"] if c.get("logprobs")]
        assert all(len(p["token_stats"]) == len(p["content"]) for p in pieces)
        assert [s for p in pieces for s in p["token_stats"]] == whole["token_stats"]
