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
