"""`ReplayPlan` and `BeamPlan` without a model: the bodies a replay sends and in which order,
a failed run of its batch, and the beam searches' settings and step budget."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from workbench.verbs.beams import BeamPlan
from workbench.verbs.replay import ReplayPlan


def test_a_replay_sends_the_reference_twice_then_the_others_before_it():
    plan = ReplayPlan.of({"prompt": "Hi", "temperature": 0, "max_tokens": 3}, True, 2)
    assert plan.endpoint == "completions" and plan.salt.startswith("wb-replay-")
    assert plan.reference == {**plan.sent, "cache_salt": plan.salt}
    *others, mine = plan.batch
    assert [o["prompt"] for o in others] == ["Once upon a time", "The capital of France is"]
    assert mine == {**plan.sent, "cache_salt": plan.salt + "-batch"}
    assert plan.sent["logprobs"] == 2 and plan.sent["token_stats"] is True
    assert ReplayPlan.of({"prompt": "Hi", "seed": 1}, False, 1).sent.get("token_stats") is None
    assert ReplayPlan.of({"prompt": "a", "seed": 1}, True, 1).salt != plan.salt


def test_a_failed_run_says_which():
    plan = ReplayPlan.of({"prompt": "Hi", "temperature": 0}, True, 1)
    failed = SimpleNamespace(ok=False, error={"error": {"message": "no"}})
    with pytest.raises(RuntimeError, match="the alone run failed"):
        plan.scenario("alone", failed)
    with pytest.raises(RuntimeError, match="the batch's other request 0 failed"):
        plan.assemble(None, None, [failed, failed])


def test_beam_searches_share_their_settings_and_bound_their_steps():
    plan = BeamPlan.of(["a", [1, 2]], beam_width=3, max_tokens=5, length_penalty=0.5)
    assert (plan.params.beam_width, plan.params.max_tokens, plan.params.length_penalty,
            plan.params.ignore_eos) == (3, 5, 0.5, False)
    assert plan.steps == 10
    out = SimpleNamespace(tree=None)
    assert plan.assemble([out]) == [out]  # a search without a tree keeps none
