"""Every error path: status, error type, param and message, as the reference server answers."""

from __future__ import annotations

import openai
import pytest

from tests.http.conftest import MAX_MODEL_LEN, MODEL

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Hi"}]


def error_of(call, **kwargs) -> tuple[int, dict]:
    with pytest.raises(openai.APIStatusError) as info:
        call(**kwargs)
    return info.value.status_code, info.value.body


def complete(client, **kwargs):
    return error_of(client.completions.create, **{"model": MODEL, "prompt": "Hi",
                                                  "max_tokens": 2, **kwargs})


def chat(client, **kwargs):
    return error_of(client.chat.completions.create, **{"model": MODEL, "messages": HI,
                                                       "max_tokens": 2, **kwargs})


def test_unknown_model_is_404(client):
    status, body = complete(client, model="gpt-4")
    assert status == 404
    assert body == {"message": f"The model `gpt-4` does not exist. Valid aliases: {MODEL}.",
                    "type": "NotFoundError", "param": "model", "code": 404}


@pytest.mark.parametrize("field, value, message", [
    ("temperature", -1.0, "temperature must be non-negative, got -1.0."),
    ("top_p", 2.0, "top_p must be in (0, 1], got 2.0."),
    ("presence_penalty", 3.0, "presence_penalty must be in [-2, 2], got 3.0."),
    ("top_k", -5, "top_k must be 0 (disable), or at least 1, got -5."),
    ("min_p", 1.5, "min_p must be in [0, 1], got 1.5."),
    ("repetition_penalty", 0.0, "repetition_penalty must be greater than zero, got 0.0."),
])
def test_bad_sampling_values_name_their_param(client, field, value, message):
    status, body = complete(client, extra_body={field: value})
    assert (status, body["type"], body["param"]) == (400, "BadRequestError", field)
    assert body["message"] == f"{message} (parameter={field}, value={value})"


def test_n_above_one_with_greedy_sampling(client):
    status, body = chat(client, n=2, temperature=0)
    assert (status, body["type"], body["param"]) == (400, "BadRequestError", "n")
    assert body["message"] == "n must be 1 when using greedy sampling, got 2. (parameter=n, value=2)"


def test_too_many_logprobs(client):
    status, body = complete(client, logprobs=21)
    assert (status, body["param"]) == (400, "logprobs")
    assert body["message"].startswith("Requested sample logprobs of 21, which is greater than "
                                      "max allowed: 20")


def test_prompt_longer_than_the_context(client):
    status, body = complete(client, prompt=[19556] * (MAX_MODEL_LEN + 10))
    assert (status, body["type"], body["param"]) == (400, "BadRequestError", "input_tokens")
    assert body["message"] == (
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt "
        f"contains {MAX_MODEL_LEN + 10} input tokens, which exceeds this limit even without any "
        f"output tokens. Please reduce the length of the input prompt. "
        f"(parameter=input_tokens, value={MAX_MODEL_LEN + 10})")


def test_max_tokens_above_the_context(client):
    status, body = complete(client, max_tokens=MAX_MODEL_LEN + 1)
    assert (status, body["param"]) == (400, "max_tokens")
    assert body["message"].startswith(f"max_tokens={MAX_MODEL_LEN + 1} cannot be greater than "
                                      f"max_model_len={MAX_MODEL_LEN}. Please request fewer")
    status, body = chat(client, max_completion_tokens=MAX_MODEL_LEN + 1)
    assert (status, body["param"]) == (400, "max_completion_tokens")


def test_prompt_plus_max_tokens_beyond_the_context_is_clamped(client):
    prompt = [19556] * (MAX_MODEL_LEN - 3)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=100, temperature=0)
    assert r.usage.completion_tokens <= 3


def test_truncate_prompt_tokens_above_the_context(client):
    status, body = complete(client, extra_body={"truncate_prompt_tokens": MAX_MODEL_LEN + 1})
    assert (status, body["param"]) == (400, "truncate_prompt_tokens")
    assert "Please request a smaller truncation size." in body["message"]


def test_out_of_vocabulary_token_prompt(client):
    status, body = complete(client, prompt=[1, 10**6])
    assert (status, body["param"]) == (400, "prompt")
    assert body["message"].startswith("Token id 1000000 is out of vocabulary")


def test_stream_options_without_stream(client):
    status, body = chat(client, stream_options={"include_usage": True})
    assert (status, body["type"], body["param"]) == (400, "BadRequestError", "stream_options")
    assert body["message"] == ("Stream options can only be defined when `stream=True`. "
                               "(parameter=stream_options)")


def test_prompt_logprobs_with_stream(client):
    status, body = complete(client, stream=True, extra_body={"prompt_logprobs": 1})
    assert (status, body["type"], body["param"]) == (400, "BadRequestError", "prompt_logprobs")
    assert body["message"].startswith("`prompt_logprobs` are not available when `stream=True`.")


def test_untrusted_chat_template(client):
    status, body = chat(client, extra_body={"chat_template": "{{ messages }}"})
    assert (status, body["type"], body["param"]) == (400, "BadRequestError", "chat_template")
    assert body["message"].startswith("Chat template is passed with request, but "
                                      "--trust-request-chat-template is not set.")


def test_tool_choice_without_a_parser(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    status, body = chat(client, tools=tools)
    assert (status, body["param"]) == (400, "tool_choice")
    assert body["message"].startswith('"auto" tool choice requires --enable-auto-tool-choice')


def test_removed_guided_fields_are_refused_not_ignored(client):
    status, body = complete(client, extra_body={"guided_json": {"type": "object"}})
    assert (status, body["param"]) == (400, "guided_json")


def test_missing_field_is_a_400_in_vllms_words(http):
    r = http.post("/v1/chat/completions", json={"model": MODEL})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', "
                   "'msg': 'Field required', 'input': '<dict of 1 items>'}",
        "type": "Bad Request", "param": "body.messages", "code": 400}


def test_out_of_range_seed_is_pydantics_error_as_vllm_words_it(http):
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "seed": 2**64})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "1 validation error:\n  {'type': 'less_than_equal', 'loc': 'body.seed', "
                   "'msg': 'Input should be less than or equal to 9223372036854775807', "
                   "'input': '18446744073709551616', 'ctx': {'le': 9223372036854775807}}",
        "type": "Bad Request", "param": "body.seed", "code": 400}


def test_malformed_json(http):
    r = http.post("/v1/completions", content=b'{"prompt": ', headers={"content-type":
                                                                       "application/json"})
    error = r.json()["error"]
    assert (r.status_code, error["type"], error["code"]) == (400, "Bad Request", 400)
    assert "JSON decode error" in error["message"]


def test_wrong_content_type(http):
    r = http.post("/v1/completions", content=b'{"prompt": "x"}',
                  headers={"content-type": "text/plain"})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == ("1 validation error:\n  Unsupported Media Type: "
                                            "Only 'application/json' is allowed")


def test_unknown_route_is_an_error_envelope(http):
    r = http.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "Not Found"
