"""A failure inside an engine step reaches the user: the engine's log names the request and
the cause (one traceback per failure), the request's output carries it as `error`, and the
offline `LLM` raises `EngineStepError` instead of returning empty outputs."""

from __future__ import annotations

import logging

import pytest

from tests.engine.helpers import BAD_SEED, faulty_sampler, greedy, make_llm
from workbench.errors import EngineStepError
from workbench.pooling_params import PoolingParams
from workbench.sampling_params import BeamSearchParams, SamplingParams

PROMPTS = ["Once upon a time there was a", "Hello", "The capital of France is"]
CAUSE = "RuntimeError: simulated kernel failure"


@pytest.fixture
def llm(tiny_llama):
    return make_llm(tiny_llama)


def break_model(monkeypatch, engine) -> None:
    """Every forward of the engine's model raises."""
    def execute(out):
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(engine.runner, "execute", execute)


def _engine_errors(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name.startswith("workbench.engine") and r.levelno >= logging.ERROR]


def test_a_model_failure_is_logged_once_with_its_request_ids_and_cause(llm, monkeypatch, caplog):
    engine = llm.llm_engine
    engine.add_request("a", PROMPTS[0], greedy(4))
    engine.add_request("b", PROMPTS[1], greedy(4))
    break_model(monkeypatch, engine)
    with caplog.at_level(logging.ERROR, logger="workbench.engine"):
        engine.step()
    (record,) = _engine_errors(caplog)
    assert "a, b" in record.getMessage() and CAUSE in record.getMessage()
    assert record.exc_info is not None and "simulated kernel failure" in caplog.text


def test_a_model_failure_is_each_output_s_error(llm, monkeypatch):
    engine = llm.llm_engine
    engine.add_request("a", PROMPTS[0], greedy(4))
    engine.add_request("b", PROMPTS[1], SamplingParams(n=2, max_tokens=4))
    break_model(monkeypatch, engine)
    outs = engine.step()
    assert [(o.request_id, o.error) for o in outs] == [("a", CAUSE), ("b", CAUSE)]
    assert [c.finish_reason for o in outs for c in o.outputs] == ["error"] * 3


def test_a_request_s_own_fault_is_logged_with_its_id_and_only_it_has_an_error(
        llm, monkeypatch, caplog):
    engine = llm.llm_engine
    monkeypatch.setattr(engine.generation_handler, "sampler",
                        faulty_sampler(engine.generation_handler.sampler))
    engine.add_request("good", PROMPTS[0], greedy(4))
    engine.add_request("bad", PROMPTS[1], SamplingParams(max_tokens=4, seed=BAD_SEED))
    finals = {}
    with caplog.at_level(logging.ERROR, logger="workbench.engine"):
        while engine.has_unfinished_requests():
            finals.update({o.request_id: o for o in engine.step() if o.finished})
    (record,) = _engine_errors(caplog)
    assert "request bad failed" in record.getMessage()
    assert finals["bad"].error == "RuntimeError: injected sampler fault"
    assert finals["good"].error is None and finals["good"].outputs[0].finish_reason == "length"


def test_generate_raises_naming_the_request_and_the_cause(llm, monkeypatch):
    break_model(monkeypatch, llm.llm_engine)
    with pytest.raises(EngineStepError, match=f"Request llm-0 failed in the engine: {CAUSE}"):
        llm.generate(PROMPTS[0], greedy(4))


def test_the_raised_error_holds_every_output_the_good_ones_finished(llm, monkeypatch):
    handler = llm.llm_engine.generation_handler
    monkeypatch.setattr(handler, "sampler", faulty_sampler(handler.sampler))
    params = [greedy(4), SamplingParams(max_tokens=4, seed=BAD_SEED), greedy(4)]
    with pytest.raises(EngineStepError) as info:
        llm.generate(PROMPTS, params)
    outs = info.value.outputs
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "error", "length"]
    assert info.value.errors == {outs[1].request_id: "RuntimeError: injected sampler fault"}
    assert all(len(outs[i].outputs[0].token_ids) == 4 for i in (0, 2))


def test_chat_raises_too(llm, monkeypatch):
    break_model(monkeypatch, llm.llm_engine)
    with pytest.raises(EngineStepError, match=CAUSE):
        llm.chat([{"role": "user", "content": "Hi"}], greedy(4))


def test_a_failed_beam_search_has_its_error_and_beam_search_raises(llm, monkeypatch):
    break_model(monkeypatch, llm.llm_engine)
    with pytest.raises(EngineStepError, match=CAUSE) as info:
        llm.beam_search(PROMPTS[0], BeamSearchParams(beam_width=2, max_tokens=3))
    (out,) = info.value.outputs
    assert out.error == CAUSE and out.to_request_output().error == CAUSE


def test_a_failed_pooling_request_has_its_error(llm, monkeypatch):
    engine = llm.llm_engine
    got = []
    engine.add_pooling_request("p", PROMPTS[0], PoolingParams(task="embed"), on_output=got.append)
    break_model(monkeypatch, engine)
    engine.step()
    assert [(o.finish_reason, o.error) for o in got] == [("error", CAUSE)]


def test_the_message_groups_many_failures_by_cause():
    errors = {f"llm-{i}": CAUSE for i in range(7)} | {"llm-7": "KeyError: 'x'"}
    assert str(EngineStepError(errors)) == (
        f"8 requests failed in the engine: {CAUSE} (llm-0, llm-1, llm-2, llm-3, llm-4 and 2 "
        "more); KeyError: 'x' (llm-7)")
