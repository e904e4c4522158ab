"""Issue 16 item 1: every field the OpenAI API defines is accepted; those with no effect here
are named in the validation report and in a warning; names neither OpenAI nor vLLM define are
refused; `metadata` stays within OpenAI's limits; the Responses store honours `store: false`.
"""

from __future__ import annotations

import logging

import pytest

MSG = [{"role": "user", "content": "hi"}]
OPENAI_CHAT_FIELDS = {
    "store": True, "metadata": {"team": "a"}, "service_tier": "auto",
    "prompt_cache_key": "k1", "prompt_cache_retention": "24h", "safety_identifier": "u-1",
    "verbosity": "low", "modalities": ["text"], "prediction": {"type": "content",
                                                                 "content": "hello"},
}


@pytest.fixture
def http(tiny_http):  # a server on the tiny llama (tests/http/conftest.py)
    return tiny_http


@pytest.mark.parametrize("name", sorted(OPENAI_CHAT_FIELDS))
def test_openai_chat_fields_are_accepted(http, name):
    body = {"messages": MSG, "max_tokens": 2, name: OPENAI_CHAT_FIELDS[name]}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


def test_no_effect_fields_are_in_the_report_and_logged(http, caplog):
    body = {"messages": MSG, "max_tokens": 2, **OPENAI_CHAT_FIELDS}
    report = http.post("/v1/validate", json=body).json()
    assert report["ok"], report
    ignored = {c["param"]: c["reason"] for c in report["checks"] if c["status"] == "ignored"}
    assert set(OPENAI_CHAT_FIELDS) <= set(ignored)
    assert "no effect" in ignored["store"]
    with caplog.at_level(logging.WARNING, logger="workbench.serving"):
        assert http.post("/v1/chat/completions", json=body).status_code == 200
    lines = [r.getMessage() for r in caplog.records if "has no effect here" in r.getMessage()]
    assert lines and all(f"`{name}`" in lines[0] for name in OPENAI_CHAT_FIELDS)


def test_a_typo_is_still_refused_by_name(http):
    r = http.post("/v1/chat/completions", json={"messages": MSG, "temprature": 0.2})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "temprature"


@pytest.mark.parametrize("field, value", [
    ("modalities", ["text", "audio"]),
    ("audio", {"voice": "alloy", "format": "wav"}),
    ("web_search_options", {}),
    ("functions", [{"name": "f", "parameters": {}}]),
])
def test_fields_asking_for_what_is_not_here_are_refused_by_name(http, field, value):
    r = http.post("/v1/chat/completions", json={"messages": MSG, field: value})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == field


@pytest.mark.parametrize("metadata, what", [
    ({f"k{i}": "v" for i in range(17)}, "too many properties"),
    ({"k" * 65: "v"}, "key too long"),
    ({"k": "v" * 513}, "value too long"),
])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_metadata_keeps_openai_limits(http, path, metadata, what):
    body = ({"messages": MSG} if "chat" in path else {"input": "hi"})
    r = http.post(path, json={**body, "max_tokens" if "chat" in path else "max_output_tokens": 2,
                              "metadata": metadata})
    assert r.status_code == 400, r.text
    assert what in r.json()["error"]["message"]


def test_metadata_within_limits_is_kept_on_a_response(http):
    metadata = {f"k{i}": "v" * 512 for i in range(16)}
    r = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2,
                                          "metadata": metadata})
    assert r.status_code == 200, r.text
    assert r.json()["metadata"] == metadata


def test_responses_store_false_is_honoured(http):
    r = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2, "store": False})
    assert r.status_code == 200, r.text
    assert r.json()["store"] is False
    assert http.get(f"/v1/responses/{r.json()['id']}").status_code == 404
    kept = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2})
    assert http.get(f"/v1/responses/{kept.json()['id']}").status_code == 200


@pytest.mark.parametrize("name, value", [
    ("prompt_cache_key", "k"), ("safety_identifier", "u"), ("prompt_cache_retention", "24h"),
    ("stream_options", {"include_obfuscation": False}),
])
def test_openai_responses_fields_are_accepted(http, name, value):
    r = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2, name: value})
    assert r.status_code == 200, r.text


def test_responses_conversation_is_refused_by_name(http):
    r = http.post("/v1/responses", json={"input": "hi", "conversation": "conv_1"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "conversation"


def test_responses_text_verbosity_is_accepted_and_other_text_keys_refused(http, caplog):
    with caplog.at_level(logging.WARNING, logger="workbench.serving"):
        r = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2,
                                              "text": {"verbosity": "low"}})
    assert r.status_code == 200, r.text
    assert any("text.verbosity" in rec.getMessage() for rec in caplog.records)
    r = http.post("/v1/responses", json={"input": "hi", "text": {"formta": {"type": "text"}}})
    assert r.status_code == 400 and "text.formta" in r.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_vllms_render_only_fields_are_accepted_as_no_effect(http, path):
    body = {"messages": MSG} if "chat" in path else {"prompt": "hi"}
    body = {**body, "max_tokens": 2, "return_token_offsets": True, "return_mm_kwargs": False}
    assert http.post(path, json=body).status_code == 200
    report = http.post("/v1/validate", json=body).json()
    ignored = {c["param"] for c in report["checks"] if c["status"] == "ignored"}
    assert {"return_token_offsets", "return_mm_kwargs"} <= ignored


@pytest.mark.parametrize("field, value", [("ec_transfer_params", {"a": 1}),
                                          ("routed_experts_prompt_start", 0)])
def test_vllm_extras_not_built_here_are_refused_by_name(http, field, value):
    r = http.post("/v1/chat/completions", json={"messages": MSG, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert "Unknown field" not in r.json()["error"]["message"]


def test_responses_vllm_extras(http):
    r = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2,
                                          "skip_special_tokens": False, "session_id": "s",
                                          "include_stop_str_in_output": True})
    assert r.status_code == 200, r.text
    r = http.post("/v1/responses", json={"input": "hi", "watermarking": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "watermarking"


def test_responses_sampling_extras_reach_the_sampling_params():
    from workbench.serving.protocol.responses import ResponsesRequest
    from workbench.serving.responses.loop import sampling_params

    params = sampling_params(ResponsesRequest(input="hi", skip_special_tokens=False,
                                              include_stop_str_in_output=True), 4, {})
    assert params.skip_special_tokens is False and params.include_stop_str_in_output is True


def test_pooling_padding_as_vllm_names_it(http):
    ok = http.post("/v1/embeddings", json={"input": "hi", "padding": "do_not_pad"})
    assert ok.status_code == 200, ok.text
    r = http.post("/v1/embeddings", json={"input": "hi", "padding": "max_length"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "padding"


def test_strict_tools_under_auto_say_they_are_not_constrained(caplog):
    from workbench.serving.protocol.chat import ChatCompletionRequest
    from workbench.serving.unsupported import check_chat

    tool = {"type": "function", "function": {"name": "f", "strict": True,
                                              "parameters": {"type": "object"}}}
    request = ChatCompletionRequest(messages=MSG, tools=[tool], tool_choice="auto")
    assert request.tools[0].function.strict is True and not request.tools[0].function.model_extra
    with caplog.at_level(logging.WARNING, logger="workbench.serving"):
        check_chat(request)
    assert any("`strict` tools ['f']" in r.getMessage() for r in caplog.records)
