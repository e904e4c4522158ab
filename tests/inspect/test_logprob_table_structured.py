"""`LogprobTable` over a constrained generation: what the grammar allowed and masked, per token."""

from __future__ import annotations

import pytest

from tests.engine.helpers import greedy, make_llm
from workbench.inspect.logprob_table import LogprobTable


@pytest.fixture(scope="module")
def outputs(tiny_llama):
    llm = make_llm(tiny_llama)
    so = {"choice": ["positive", "negative"]}
    with_lps = llm.generate("x", greedy(10, logprobs=3, structured_outputs=so))[0]
    without = llm.generate("x", greedy(10, structured_outputs=so))[0]
    free = llm.generate("x", greedy(4, logprobs=3))[0]
    return with_lps, without, free


def test_rows_carry_the_grammar_steps(outputs, tiny_llama):
    out = outputs[0]
    table = LogprobTable.from_request_output(out, tokenizer=tiny_llama.tokenizer)
    steps = out.outputs[0].grammar_steps
    assert table.constrained and len(table) == len(steps)
    assert [r.allowed for r in table] == [s.num_allowed for s in steps]
    first = table[0]
    assert {a.token_id for a in first.masked} == set(steps[0].masked)
    assert first.overruled and 0 in table.overruled  # the random model's favourite is noise
    flagged = {a.token_id for a in first.top if a.masked}
    assert flagged == {a.token_id for a in first.top} & set(steps[0].masked)
    assert first.top[0].masked  # the raw top-1 was not allowed
    assert not any(a.masked for a in first.top if a.token_id == first.token_id)


def test_frame_and_html_show_the_grammar(outputs, tiny_llama):
    table = LogprobTable.from_request_output(outputs[0], tokenizer=tiny_llama.tokenizer)
    frame = table.to_frame()
    assert list(frame.columns[-3:]) == ["allowed", "overruled", "masked"]
    assert frame["allowed"].tolist() == [r.allowed for r in table]
    html = table._repr_html_()
    assert "grammar: " in html and "masked" in html and "dashed" in html


def test_a_table_without_logprobs_still_shows_the_grammar(outputs, tiny_llama):
    out = outputs[1]
    table = LogprobTable.from_request_output(out, tokenizer=tiny_llama.tokenizer)
    assert len(table) == len(out.outputs[0].token_ids)
    assert all(r.logprob is None and r.allowed is not None for r in table)
    assert table[0].masked and table[0].overruled


def test_unconstrained_tables_are_unchanged(outputs):
    table = LogprobTable.from_request_output(outputs[2])
    assert not table.constrained and table.overruled == []
    assert "allowed" not in table.to_frame().columns
    assert "allowed" not in table.to_dict()["rows"][0]
    assert "masked" not in table.to_dict()["rows"][0]["top"][0]
