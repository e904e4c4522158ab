"""`response_format` and `structured_outputs` -> one `StructuredOutputsParams` (no model)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from workbench.errors import ValidationError
from workbench.serving.structured import structured_outputs_from_request

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def request(**fields):
    base = {"response_format": None, "structured_outputs": None, "use_beam_search": False}
    return SimpleNamespace(**{**base, **fields})


def test_nothing_asked_is_no_constraint():
    assert structured_outputs_from_request(request()) is None
    assert structured_outputs_from_request(request(response_format={"type": "text"})) is None


def test_json_schema_becomes_json_named_after_response_format():
    so = structured_outputs_from_request(request(response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}))
    assert so.json == SCHEMA and so.kind == "json" and so.parameter == "response_format"


def test_json_object_and_extras():
    so = structured_outputs_from_request(request(response_format={"type": "json_object"}))
    assert so.json_object is True
    so = structured_outputs_from_request(request(structured_outputs={
        "regex": "a+", "disable_any_whitespace": None}))
    assert so.regex == "a+" and so.parameter == "structured_outputs"


def test_response_format_overrides_the_same_field_and_keeps_options():
    so = structured_outputs_from_request(request(
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
        structured_outputs={"json": {"type": "string"}, "disable_any_whitespace": True}))
    assert so.json == SCHEMA and so.disable_any_whitespace


@pytest.mark.parametrize("fields, param, message", [
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"choice": ["a"]}},
     "response_format", "only use one kind"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
     "response_format", "name is required"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format", "must be a JSON schema"),
    ({"response_format": {"type": "yaml"}}, "response_format", "'yaml' is not supported"),
    ({"response_format": {"type": "structural_tag"}}, "response_format", "structural_tag"),
    ({"structured_outputs": {"backend": "xgrammar", "regex": "a"}}, "structured_outputs",
     "backend"),
    ({"structured_outputs": {"regx": "a"}}, "structured_outputs", "unknown field"),
    ({"structured_outputs": {"regex": "a", "disable_any_whitespace": "yes"}},
     "structured_outputs", "must be a boolean"),
    ({"structured_outputs": {"choice": ["a"]}, "use_beam_search": True}, "structured_outputs",
     "beam search"),
])
def test_refusals_name_the_field(fields, param, message):
    with pytest.raises(ValidationError, match=message) as err:
        structured_outputs_from_request(request(**fields))
    assert err.value.parameter == param


async def test_with_r1_reasoning_response_format_starts_after_the_end_tag(tokenizer):
    from tests.serving.test_tool_parsers_chat import chat
    from workbench.serving import RequestMeta
    from workbench.serving.protocol import ChatCompletionRequest

    body = dict(messages=[{"role": "user", "content": "Hi"}], max_tokens=50,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "x", "schema": SCHEMA}})
    serving = chat(tokenizer, "{}", reasoning_parser="deepseek_r1")
    await serving.create(ChatCompletionRequest(**body), RequestMeta())
    so = serving.engine.submitted[-1][2].structured_outputs
    assert so.json == SCHEMA
    assert so.after_token_ids == tokenizer.encode("</think>", add_special_tokens=False)
    serving = chat(tokenizer, "{}")  # no reasoning parser: from the first token
    await serving.create(ChatCompletionRequest(**body), RequestMeta())
    assert serving.engine.submitted[-1][2].structured_outputs.after_token_ids is None
