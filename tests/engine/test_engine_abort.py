"""Aborted and failed requests: blocks freed at once, a final output with finish_reason
'abort' / 'error', and the engine goes on serving everything else."""

import pytest

from tests.engine.helpers import greedy, make_llm
from workbench.errors import EngineStepError
from workbench.sampling_params import RequestOutputKind, SamplingParams

PROMPT = "Once upon a time there was a"
BLOCKS = 32


@pytest.fixture()
def llm(tiny_llama):
    return make_llm(tiny_llama, max_model_len=128, block_size=4, num_kv_blocks=BLOCKS)


def finish_all(engine) -> dict:
    finals = {}
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    return finals


def test_abort_frees_a_running_request_blocks_at_once(llm):
    engine = llm.llm_engine
    engine.add_request("r", PROMPT, greedy(50, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert engine.block_manager.num_free_blocks < BLOCKS
    engine.abort_request("r")
    assert engine.block_manager.num_free_blocks == BLOCKS  # before any further step
    assert not engine.scheduler.has_unfinished()


def test_an_aborted_request_ends_with_finish_reason_abort(llm):
    engine = llm.llm_engine
    engine.add_request("r", PROMPT, greedy(50, ignore_eos=True))
    engine.step()
    engine.step()
    engine.abort_request("r")
    outs = engine.step()
    assert [o.request_id for o in outs] == ["r"]
    final = outs[0]
    assert final.finished and final.outputs[0].finish_reason == "abort"
    assert len(final.outputs[0].token_ids) == 2
    assert not engine.has_unfinished_requests()


def test_aborting_a_waiting_request_before_any_step(llm):
    engine = llm.llm_engine
    engine.add_request("r", PROMPT, greedy(8))
    engine.abort_request("r")
    (final,) = engine.step()
    assert final.outputs[0].finish_reason == "abort" and final.outputs[0].token_ids == []
    assert engine.block_manager.num_free_blocks == BLOCKS


def test_aborting_a_request_with_n_samples_ends_them_all(llm):
    engine = llm.llm_engine
    engine.add_request("r", PROMPT, SamplingParams(n=3, max_tokens=50, ignore_eos=True))
    for _ in range(3):
        engine.step()
    engine.abort_request("r")
    assert engine.block_manager.num_free_blocks == BLOCKS
    (final,) = engine.step()
    assert [c.finish_reason for c in final.outputs] == ["abort"] * 3


def test_an_aborted_delta_stream_ends_with_an_abort_output(llm):
    engine = llm.llm_engine
    engine.add_request("r", PROMPT, SamplingParams(temperature=0.0, max_tokens=50,
                                                   output_kind=RequestOutputKind.DELTA))
    engine.step()
    engine.abort_request("r")
    (final,) = engine.step()
    assert final.finished and final.outputs[0].finish_reason == "abort"


def test_aborting_an_unknown_or_finished_request_is_a_no_op(llm):
    engine = llm.llm_engine
    llm.generate(PROMPT, greedy(2))
    engine.abort_request(["nobody", "llm-0"])
    assert engine.step() == []


def test_other_requests_are_unaffected_by_an_abort(llm):
    want = llm.generate(["Hello", "Goodbye"], greedy(12, ignore_eos=True))
    engine = llm.llm_engine
    for rid, prompt in [("a", "Hello"), ("doomed", PROMPT), ("b", "Goodbye")]:
        engine.add_request(rid, prompt, greedy(12, ignore_eos=True))
    engine.step()
    engine.step()
    engine.abort_request("doomed")
    finals = finish_all(engine)
    assert finals["doomed"].outputs[0].finish_reason == "abort"
    assert finals["a"].outputs[0].token_ids == want[0].outputs[0].token_ids
    assert finals["b"].outputs[0].token_ids == want[1].outputs[0].token_ids
    assert engine.block_manager.num_free_blocks == BLOCKS


def fail_once(monkeypatch, engine) -> None:
    """The runner's next execute raises; later ones work."""
    real = engine.runner.execute
    calls = {"n": 0}

    def execute(out):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated kernel failure")
        return real(out)

    monkeypatch.setattr(engine.runner, "execute", execute)


def test_a_model_failure_ends_the_scheduled_requests_with_error(llm, monkeypatch):
    engine = llm.llm_engine
    engine.add_request("a", PROMPT, greedy(8))
    engine.add_request("b", "Hello", greedy(8))
    fail_once(monkeypatch, engine)
    outs = engine.step()
    assert sorted(o.request_id for o in outs) == ["a", "b"]
    assert all(o.finished and o.outputs[0].finish_reason == "error" for o in outs)
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == BLOCKS


def test_the_engine_serves_later_requests_after_a_model_failure(llm, monkeypatch):
    want = llm.generate(PROMPT, greedy(8))[0].outputs[0].token_ids
    fail_once(monkeypatch, llm.llm_engine)
    with pytest.raises(EngineStepError) as info:
        llm.generate(PROMPT, greedy(8))
    assert info.value.outputs[0].outputs[0].finish_reason == "error"
    assert llm.generate(PROMPT, greedy(8))[0].outputs[0].token_ids == want


def test_a_model_failure_spares_requests_not_in_the_failed_step(tiny_llama, monkeypatch):
    llm = make_llm(tiny_llama, max_model_len=128, block_size=4, num_kv_blocks=BLOCKS, max_num_seqs=1)
    want = llm.generate("Hello", greedy(6))[0].outputs[0].token_ids
    engine = llm.llm_engine
    engine.add_request("first", PROMPT, greedy(6))
    engine.add_request("waiting", "Hello", greedy(6))  # max_num_seqs=1: not in the first step
    fail_once(monkeypatch, engine)
    finals = finish_all(engine)
    assert finals["first"].outputs[0].finish_reason == "error"
    assert finals["waiting"].outputs[0].token_ids == want


def test_a_failure_in_the_middle_of_decoding_keeps_the_tokens_so_far(llm, monkeypatch):
    engine = llm.llm_engine
    engine.add_request("r", PROMPT, greedy(8))
    engine.step()
    engine.step()
    fail_once(monkeypatch, engine)
    (final,) = engine.step()
    assert final.outputs[0].finish_reason == "error" and len(final.outputs[0].token_ids) == 2


def test_aborting_n_samples_before_they_fork_still_ends_all_of_them(llm):
    engine = llm.llm_engine
    engine.add_request("r", PROMPT, SamplingParams(n=3, max_tokens=5,
                                                   output_kind=RequestOutputKind.DELTA))
    engine.abort_request("r")
    (final,) = engine.step()
    assert [(c.index, c.finish_reason) for c in final.outputs] == [(i, "abort") for i in range(3)]
    assert engine.block_manager.num_free_blocks == BLOCKS


def test_a_model_failure_before_the_fork_ends_every_sample_with_error(llm, monkeypatch):
    engine = llm.llm_engine
    engine.add_request("r", PROMPT, SamplingParams(n=2, max_tokens=5))
    fail_once(monkeypatch, engine)
    (final,) = engine.step()
    assert [c.finish_reason for c in final.outputs] == ["error", "error"]
