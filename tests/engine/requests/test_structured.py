"""Structured outputs in the engine: the grammar mask holds whatever the model would say.

The tiny random llama would write noise; under a constraint its every output must still match
(regex, choice, JSON schema). Also: batching beside unconstrained rows, n > 1, preemption, the
grammar steps recorded per token, the trigger (`after_token_ids`), compile errors and caching.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from tests.engine.helpers import greedy, make_llm
from workbench.engine.requests.outputs import GrammarStep
from workbench.errors import ValidationError
from workbench.sampling_params import SamplingParams, StructuredOutputsParams

PROMPTS = ["Once upon a time", "The weather today is", "Hello, my name is"]
# bounded by the grammar itself, so a random model finishes well within the budget
SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
        "ok": {"type": "boolean"},
    },
    "required": ["colour", "count", "ok"],
    "additionalProperties": False,
}


def constrained(max_tokens: int = 40, **so) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=0, max_tokens=max_tokens,
                          structured_outputs=StructuredOutputsParams(**so))


def test_a_random_model_matches_the_regex(tiny_llama):
    llm = make_llm(tiny_llama)
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=20,
                             structured_outputs={"regex": r"[a-c]{2}-\d{3}"}) for s in range(6)]
    for out in llm.generate(["x"] * 6, params):
        text = out.outputs[0].text
        assert re.fullmatch(r"[a-c]{2}-[0-9]{3}", text), text
        assert out.outputs[0].finish_reason == "stop"


def test_a_random_model_picks_one_choice(tiny_llama):
    llm = make_llm(tiny_llama)
    choices = ["alpha", "beta gamma", "δ"]
    texts = {out.outputs[0].text for out in llm.generate(
        PROMPTS, constrained(choice=choices))}
    assert texts <= set(choices)


def test_a_random_model_writes_json_that_validates(tiny_llama):
    llm = make_llm(tiny_llama)
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=60, structured_outputs={
        "json": SCHEMA, "disable_any_whitespace": True}) for s in range(4)]
    for out in llm.generate(["a"] * 4, params):
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)


def test_json_object_gives_an_object(tiny_llama):
    llm = make_llm(tiny_llama)
    out = llm.generate("x", constrained(max_tokens=120, json_object=True,
                                        disable_any_whitespace=True))[0].outputs[0]
    if out.finish_reason == "stop":  # a random model may keep an object open to the budget
        assert isinstance(json.loads(out.text), dict)
    assert out.text.startswith("{")


def test_unconstrained_rows_are_unchanged_by_constrained_neighbours(tiny_llama):
    llm = make_llm(tiny_llama)
    alone = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy(12, ignore_eos=True))]
    mixed = llm.generate(PROMPTS * 2, [greedy(12, ignore_eos=True)] * 3 + [
        greedy(12, structured_outputs={"choice": ["yes", "no"]})] * 3)
    assert [o.outputs[0].token_ids for o in mixed[:3]] == alone
    assert all(o.outputs[0].text in ("yes", "no") for o in mixed[3:])
    assert all(o.outputs[0].grammar_steps is None for o in mixed[:3])


def test_each_of_n_samples_follows_the_grammar(tiny_llama):
    llm = make_llm(tiny_llama)
    params = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=20,
                            structured_outputs={"regex": r"(ab|cd)[0-9]{4}"})
    outs = llm.generate("Hello", params)[0].outputs
    assert len(outs) == 4
    assert all(re.fullmatch(r"(ab|cd)[0-9]{4}", o.text) for o in outs), [o.text for o in outs]
    assert len({o.text for o in outs}) > 1  # own matchers, own samples


def test_preemption_keeps_the_matcher_state(tiny_llama):
    params = [SamplingParams(temperature=1.0, seed=i, n=2, max_tokens=30,
                             structured_outputs={"regex": r"[a-z]{10,20}\.[0-9]{5}"})
              for i in range(4)]
    prompts = ["Once upon a time " * 3, "The weather today is " * 3, "Hello " * 6, "1 2 3 4 " * 3]
    roomy = make_llm(tiny_llama, max_model_len=64, block_size=4, num_kv_blocks=256)
    tight = make_llm(tiny_llama, max_model_len=64, block_size=4, num_kv_blocks=16)
    want = [[c.text for c in o.outputs] for o in roomy.generate(prompts, params)]
    got = [[c.text for c in o.outputs] for o in tight.generate(prompts, params)]
    assert tight.llm_engine.stats().num_preemptions > 0
    assert got == want
    assert all(re.fullmatch(r"[a-z]{10,20}\.[0-9]{5}", t) for texts in got for t in texts)


def test_grammar_steps_say_what_was_masked(tiny_llama):
    llm = make_llm(tiny_llama)
    out = llm.generate("x", greedy(10, logprobs=3, structured_outputs={
        "choice": ["positive", "negative"]}))[0].outputs[0]
    steps = out.grammar_steps
    assert len(steps) == len(out.token_ids)
    assert all(isinstance(s, GrammarStep) for s in steps)
    assert steps[0].num_allowed >= 2
    # the model's favourite (raw) token is noise: masked, and reported with its raw logprob
    raw_best = max(out.logprobs[0].values(), key=lambda lp: lp.logprob)
    best_id = next(t for t, lp in out.logprobs[0].items() if lp is raw_best)
    assert best_id not in out.token_ids[:1]
    assert steps[0].masked[best_id] == pytest.approx(raw_best.logprob, abs=1e-4)
    assert steps[-1].forced  # after the last character only EOS is left
    assert out.token_ids[-1] == tiny_llama.tokenizer.eos_token_id


def test_logprobs_stay_raw(tiny_llama):
    llm = make_llm(tiny_llama)
    free = llm.generate("x", greedy(1, logprobs=5))[0].outputs[0]
    held = llm.generate("x", greedy(1, logprobs=5, structured_outputs={
        "choice": ["positive", "negative"]}))[0].outputs[0]
    top_free = {t: lp.logprob for t, lp in free.logprobs[0].items()}
    top_held = {t: lp.logprob for t, lp in held.logprobs[0].items()}
    shared = set(top_free) & set(top_held)
    assert shared and all(top_free[t] == pytest.approx(top_held[t], abs=1e-5) for t in shared)


def test_the_constraint_starts_after_the_trigger(tiny_llama):
    llm = make_llm(tiny_llama)
    tok = tiny_llama.tokenizer
    free = llm.generate("x", greedy(6, ignore_eos=True))[0].outputs[0].token_ids
    trigger = free[:2]  # what greedy decoding says anyway at first
    out = llm.generate("x", greedy(20, structured_outputs={
        "regex": "[0-9]{3}", "after_token_ids": trigger}))[0].outputs[0]
    assert out.token_ids[:2] == free[:2]
    assert out.grammar_steps[:2] == [None] * 2 and out.grammar_steps[2] is not None
    tail = tok.decode(out.token_ids[2:], skip_special_tokens=True)
    assert re.fullmatch("[0-9]{3}", tail), tail


def test_an_unsupported_schema_is_refused_by_name(tiny_llama):
    llm = make_llm(tiny_llama)
    with pytest.raises(ValidationError) as err:
        llm.generate("x", greedy(5, structured_outputs={"json": {"not": {"type": "string"}}}))
    assert err.value.parameter == "structured_outputs"
    assert "not supported" in str(err.value) and "not" in str(err.value)
    with pytest.raises(ValidationError, match="unclosed group"):
        llm.generate("x", greedy(5, structured_outputs={"regex": "a(b"}))
    with pytest.raises(ValidationError, match="Lark or GBNF"):
        llm.generate("x", greedy(5, structured_outputs={"grammar": "start: nothing_here"}))
    assert not llm.llm_engine.has_unfinished_requests()


def test_a_lark_grammar_is_followed(tiny_llama):
    llm = make_llm(tiny_llama)
    grammar = 'start: "(" NUM ("+" NUM)* ")"\nNUM: /[1-9]/'
    for out in llm.generate(["a", "b", "c"], constrained(max_tokens=30, grammar=grammar)):
        text = out.outputs[0].text
        if out.outputs[0].finish_reason == "stop":
            assert re.fullmatch(r"\([1-9](\+[1-9])*\)", text), text
        else:
            assert re.fullmatch(r"\([1-9](\+[1-9])*\+?", text), text


def test_compiled_grammars_are_cached(tiny_llama):
    llm = make_llm(tiny_llama)
    compiler = llm.llm_engine.inputs.grammars
    llm.generate(PROMPTS, greedy(5, structured_outputs={"json": SCHEMA}))
    llm.generate("again", greedy(5, structured_outputs={"json": json.dumps(SCHEMA)}))
    assert compiler.num_compiled == 1


@pytest.mark.parametrize("spec, message", [
    ({"json": {"type": "object"}, "regex": "a"}, "only use one kind"),
    ({}, "none are specified"),
    ({"choice": []}, "non-empty list"),
    ({"json_object": False}, "must be true"),
    ({"regex": "a\x00"}, "NUL"),
    ({"json": ""}, "must not be empty"),
    ({"structural_tag": "{}"}, "structural_tag is not supported"),
])
def test_bad_constraints_are_refused(spec, message):
    with pytest.raises(ValidationError, match=message):
        SamplingParams(structured_outputs=spec)


def test_deep_schemas_are_refused():
    schema: dict = {"type": "string"}
    for _ in range(70):
        schema = {"type": "array", "items": schema}
    with pytest.raises(ValidationError, match="nested too deeply"):
        StructuredOutputsParams(json=schema)


def test_schemas_with_refs_to_enums_are_followed(tiny_llama):
    # vLLM#15236: `$ref` to an enum was refused by an older backend's feature check
    schema = {"$defs": {"Colour": {"enum": ["red", "green"]}},
              "type": "object", "properties": {"c": {"$ref": "#/$defs/Colour"},
                                               "d": {"type": "array", "maxItems": 2,
                                                     "items": {"$ref": "#/$defs/Colour"}}},
              "required": ["c", "d"], "additionalProperties": False}
    llm = make_llm(tiny_llama)
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=40, structured_outputs={
        "json": schema, "disable_any_whitespace": True}) for s in range(3)]
    for out in llm.generate(["a"] * 3, params):
        jsonschema.validate(json.loads(out.outputs[0].text), schema)


def test_boolean_schemas(tiny_llama):
    llm = make_llm(tiny_llama)
    out = llm.generate("x", greedy(30, structured_outputs={"json": True,
                                                           "disable_any_whitespace": True}))
    assert out[0].outputs[0].grammar_steps  # any JSON value: constrained all the same
    with pytest.raises(ValidationError, match="accepts no value"):
        llm.generate("x", greedy(5, structured_outputs={"json": False}))
