"""Structured outputs through the official `openai` client against a live server (SmolLM2).

Every output must parse and validate against its schema (`jsonschema`), streamed or not, for
each of n samples; regex, choice and grammar through `extra_body`; schemas the backend can't
take are a 400 naming `response_format` and the keyword at fault.
"""

from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import openai
import pytest

from tests.http.conftest import MODEL

pytestmark = pytest.mark.slow

# strings are bounded and objects closed (`additionalProperties: false`, as OpenAI's strict mode
# requires) so a greedy small model always finishes within the budget
CORPUS = {
    "nested": {
        "type": "object",
        "properties": {
            "person": {"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 16},
                "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                "required": ["name", "age"], "additionalProperties": False},
            "city": {"type": "string", "maxLength": 16},
        },
        "required": ["person", "city"],
        "additionalProperties": False,
    },
    "array_of_enums": {
        "type": "object",
        "properties": {"colours": {"type": "array", "minItems": 1, "maxItems": 3,
                                   "items": {"enum": ["red", "green", "blue"]}}},
        "required": ["colours"],
        "additionalProperties": False,
    },
    "bounded_numbers": {
        "type": "object",
        "properties": {"celsius": {"type": "number", "minimum": -40, "maximum": 50},
                       "humidity": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["celsius", "humidity"],
        "additionalProperties": False,
    },
    "optional_fields": {
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 24},
                       "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
                       "rating": {"type": "number", "minimum": 0, "maximum": 5}},
        "required": ["title"],
        "additionalProperties": False,
    },
    "string_pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
                       "ok": {"type": "boolean"}},
        "required": ["code", "ok"],
        "additionalProperties": False,
    },
    "array_of_objects": {
        "type": "object",
        "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
            "type": "object",
            "properties": {"sku": {"type": "string", "minLength": 2, "maxLength": 8},
                           "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["sku", "qty"], "additionalProperties": False}}},
        "required": ["items"],
        "additionalProperties": False,
    },
}


def ask(what: str) -> list[dict]:
    return [{"role": "user", "content": f"Reply with JSON only: {what}"}]


def json_schema_format(name: str, schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                   "strict": True}}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_chat_json_schema_output_validates(client, name):
    schema = CORPUS[name]
    r = client.chat.completions.create(
        model=MODEL, messages=ask(f"an example for the schema {name}"), max_tokens=150,
        temperature=0, response_format=json_schema_format(name, schema))
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), schema)


def test_n_samples_each_validate(client):
    schema = CORPUS["nested"]
    r = client.chat.completions.create(
        model=MODEL, messages=ask("a person and the city they live in"), max_tokens=150,
        temperature=1.0, seed=7, n=3, response_format=json_schema_format("person", schema))
    assert len(r.choices) == 3
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_streamed_json_equals_the_whole_answer(client):
    schema = CORPUS["bounded_numbers"]
    kwargs = dict(model=MODEL, messages=ask("today's weather"), max_tokens=100, temperature=0,
                  response_format=json_schema_format("weather", schema))
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole
    jsonschema.validate(json.loads(streamed), schema)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_json_object(client):
    r = client.chat.completions.create(model=MODEL, messages=ask(
        'the colour of a banana, as {"colour": ...}'), max_tokens=100, temperature=0,
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_text_response_format_changes_nothing(client):
    kwargs = dict(model=MODEL, messages=ask("hi"), max_tokens=8, temperature=0)
    plain = client.chat.completions.create(**kwargs).choices[0].message.content
    text = client.chat.completions.create(**kwargs, response_format={"type": "text"})
    assert text.choices[0].message.content == plain


@pytest.mark.parametrize("extra, check", [
    ({"regex": r"\d{3}-\d{3}-\d{4}"}, lambda t: re.fullmatch(r"[0-9]{3}-[0-9]{3}-[0-9]{4}", t)),
    ({"choice": ["Paris", "London", "Rome"]}, lambda t: t in ("Paris", "London", "Rome")),
    ({"grammar": 'start: "The answer is " NUM "."\nNUM: /[0-9]+/'},
     lambda t: re.fullmatch(r"The answer is [0-9]+\.", t)),
    ({"json": {"type": "object", "properties": {"ok": {"type": "boolean"}},
               "required": ["ok"]}, "disable_any_whitespace": True,
      "disable_additional_properties": True},
     lambda t: re.fullmatch(r'\{"ok":(true|false)\}', t)),
])
def test_structured_outputs_extras(client, extra, check):
    r = client.chat.completions.create(
        model=MODEL, messages=ask("What is the capital of France? Or a phone number."),
        max_tokens=30, temperature=0, extra_body={"structured_outputs": extra})
    text = r.choices[0].message.content
    assert check(text), text
    assert r.choices[0].finish_reason == "stop"


def test_completions_take_both_forms(client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=10,
                                  temperature=0,
                                  extra_body={"structured_outputs": {"choice": [" Paris", " Rome"]}})
    assert r.choices[0].text in (" Paris", " Rome")
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 12}},
              "required": ["capital"], "additionalProperties": False}
    r = client.completions.create(model=MODEL, prompt="France as JSON:", max_tokens=40,
                                  temperature=0,
                                  extra_body={"response_format": json_schema_format("c", schema)})
    jsonschema.validate(json.loads(r.choices[0].text), schema)


async def test_unconstrained_neighbours_are_unchanged(aclient):
    plain = dict(model=MODEL, messages=ask("tell me about cats"), max_tokens=12, temperature=0)
    alone = (await aclient.chat.completions.create(**plain)).choices[0].message.content
    results = await asyncio.gather(*[
        aclient.chat.completions.create(**plain) if i % 2 == 0 else
        aclient.chat.completions.create(
            model=MODEL, messages=ask("a pet"), max_tokens=40, temperature=0,
            response_format=json_schema_format("pet", CORPUS["array_of_enums"]))
        for i in range(4)])
    assert [r.choices[0].message.content for r in results[::2]] == [alone, alone]
    for r in results[1::2]:
        jsonschema.validate(json.loads(r.choices[0].message.content), CORPUS["array_of_enums"])


@pytest.mark.parametrize("response_format, extra, words", [
    (json_schema_format("x", {"type": "object", "not": {"required": ["a"]}}), None,
     ["response_format", "not"]),
    (json_schema_format("x", {"type": "strng"}), None, ["response_format", "strng"]),
    (json_schema_format("x", {"$ref": "#/definitions/missing"}), None, ["missing"]),
    ({"type": "structural_tag", "format": {}}, None, ["structural_tag"]),
    ({"type": "json_object"}, {"structured_outputs": {"regex": "a+"}}, ["one kind"]),
    (None, {"structured_outputs": {"regex": "a(b"}}, ["regex", "unclosed group"]),
    (None, {"structured_outputs": {"grammar": "start: missing_rule"}}, ["Lark or GBNF"]),
    (None, {"structured_outputs": {"choice": []}}, ["choice"]),
    (None, {"structured_outputs": {"json": {"type": "object"}, "backend": "xgrammar"}},
     ["backend"]),
    (None, {"structured_outputs": {"jsn": {}}}, ["unknown field", "jsn"]),
])
def test_bad_constraints_are_a_400_naming_the_part(client, response_format, extra, words):
    kwargs = {"response_format": response_format} if response_format else {}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ask("x"), max_tokens=5,
                                       extra_body=extra, **kwargs)
    error = err.value.body
    assert error["param"] == ("response_format" if response_format else "structured_outputs")
    for word in words:
        assert word in error["message"], error["message"]


def test_bad_schema_in_a_stream_is_refused_before_it_starts(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=ask("x"), max_tokens=5, stream=True,
            response_format=json_schema_format("x", {"type": "strng"}))
    assert err.value.body["param"] == "response_format"


def test_structured_outputs_with_beam_search_are_refused(client):
    with pytest.raises(openai.BadRequestError, match="beam search") as err:
        client.completions.create(model=MODEL, prompt="x", max_tokens=5, n=2,
                                  extra_body={"use_beam_search": True,
                                              "structured_outputs": {"choice": ["a", "b"]}})
    assert err.value.body["param"] == "structured_outputs"


def test_removed_guided_fields_are_still_refused(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ask("x"), max_tokens=5,
                                       extra_body={"guided_regex": "a+"})
    assert err.value.body["param"] == "guided_regex"
    assert "structured_outputs" in err.value.body["message"]


def test_the_dry_run_reports_an_unsupported_schema(http):
    body = {"model": MODEL, "messages": ask("x"), "max_tokens": 5,
            "response_format": json_schema_format("x", {"type": "strng"})}
    report = http.post("/v1/validate", json=body).json()
    real = http.post("/v1/chat/completions", json=body)
    assert report["ok"] is False and report["status_code"] == real.status_code == 400
    assert report["error"] == real.json()
    assert report["error"]["error"]["param"] == "response_format"
