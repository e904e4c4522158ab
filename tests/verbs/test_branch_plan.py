"""`BranchPlan` without a model: the requests it asks for a hand-made completions body, and the
`BranchTree` it assembles from hand-made answers."""

from __future__ import annotations

import pytest

from workbench.errors import ValidationError
from workbench.inspect.branch_tree import Path, PathToken
from workbench.verbs import branch
from workbench.verbs.branch import Answer, BranchPlan, Continue, Probe


class Tokenizer:
    """Each id's text is `<id>`."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"<{i}>" for i in ids)


TOK = Tokenizer()
TOPS = [{"token_id:5": -0.1, "token_id:9": -2.0},
        {"token_id:6": -0.2, "token_id:8": -1.0, "token_id:4": -3.0},
        {"token_id:7": -0.3, "token_id:3": -1.5}]


def body(logprobs: bool = True) -> dict:
    choice = {"index": 0, "text": "<5><6><7>", "token_ids": [5, 6, 7], "prompt_token_ids": [1, 2],
              "finish_reason": "length"}
    if logprobs:
        choice["logprobs"] = {"token_logprobs": [-0.1, -0.2, -0.3], "top_logprobs": TOPS}
    return {"choices": [choice]}


def answer(ids, logprob=-0.5, top=(), cached=None, output=None) -> Answer:
    tokens = tuple(PathToken(t, f"<{t}>", logprob, tuple(top)) for t in ids)
    return Answer(Path(tokens, "".join(f"<{t}>" for t in ids), "length"), cached, output)


def test_top_n_continues_the_context_with_each_best_alternative():
    plan = BranchPlan.of(body(), TOK, 1).forcing(None, 2, 100)
    assert plan.context == [1, 2, 5] and plan.probe is None and plan.unknown == []
    assert plan.forced == [8, 4]
    assert plan.requests == [Continue([1, 2, 5, 8]), Continue([1, 2, 5, 4])]


def test_the_tree_from_the_answers():
    plan = BranchPlan.of(body(), TOK, 1).forcing(None, 2, 100)
    tree = plan.assemble([answer([11, 12], cached=3, output="a"), answer([13], output="b")])
    assert [b.token_id for b in tree.branches] == [8, 4]
    first = tree.branches[0]
    assert first.path.token_ids == [5, 8, 11, 12] and first.path.text == "<5><8><11><12>"
    assert first.path.logprobs == [-0.1, -1.0, -0.5, -0.5]  # the forced one: the output's own
    assert (first.num_cached_tokens, first.output, tree.branches[1].output) == (3, "a", "b")
    assert first.token.top == ((6, -0.2), (8, -1.0), (4, -3.0))  # the position's, sorted


def test_a_token_outside_the_top_is_probed_in_the_same_requests():
    plan = BranchPlan.of(body(), TOK, 1).forcing([8, 50], None, 100)
    assert plan.unknown == [50]
    assert plan.requests == [Continue([1, 2, 5, 8]), Continue([1, 2, 5, 50]),
                             Probe([1, 2, 5], 1, [50])]
    probed = answer([6], top=[(6, -0.2), (50, -7.0)])
    tree = plan.assemble([answer([11]), answer([12]), probed])
    assert [b.path.logprobs[1] for b in tree.branches] == [-1.0, -7.0]
    missing = plan.assemble([answer([11]), answer([12]), answer([6], top=[(6, -0.2)])])
    assert missing.branches[1].path.logprobs[1] is None  # a server that did not return it


def test_an_output_without_logprobs_asks_a_probe_first():
    plan = BranchPlan.of(body(logprobs=False), TOK, 2).forcing(None, 2, 100)
    assert plan.forced is None and plan.probe == Probe([1, 2, 5, 6], 3, [])
    plan = plan.probed(answer([7], top=[(7, -0.1), (11, -0.5), (12, -0.9)]))
    assert plan.forced == [11, 12] and plan.requests == [Continue([1, 2, 5, 6, 11]),
                                                         Continue([1, 2, 5, 6, 12])]


def test_refusals_name_the_parameter():
    with pytest.raises(ValidationError, match="out of range") as info:
        BranchPlan.of(body(), TOK, 3)
    assert info.value.parameter == "position"
    with pytest.raises(ValidationError) as info:
        branch.continuation_fields({"n": 2}, {})
    assert info.value.parameter == "n"
    fields = branch.continuation_fields({"prompt": "x", "max_tokens": 4, "n": 1}, {"seed": 1})
    assert fields == {"max_tokens": 4, "seed": 1, "logprobs": 0}


def test_a_probe_as_the_engine_and_the_server_take_it():
    probe = Probe([1, 2], 1, [50])
    params = branch.probe_params(probe)
    assert (params.max_tokens, params.temperature, params.logprobs,
            params.logprob_token_ids) == (1, 0.0, 1, [50])
    assert branch.probe_fields(probe) == {
        "prompt": [1, 2], "max_tokens": 1, "temperature": 0.0, "return_token_ids": True,
        "return_tokens_as_token_ids": True, "logprobs": 1, "logprob_token_ids": [50]}
    assert "logprob_token_ids" not in branch.probe_fields(Probe([1], 3, []))
