"""Faults inside an engine step stay with the request they belong to.

A sampler, detokenizer, output or beam-search failure for one request ends that request with
finish_reason "error"; the other requests of the same steps finish exactly as without the
fault, their blocks are freed, and the engine keeps serving.
"""

from __future__ import annotations

import pytest

from tests.engine.helpers import BAD_SEED, faulty_sampler, greedy, make_llm
from workbench.engine.requests.detokenizer import IncrementalDetokenizer
from workbench.sampling_params import BeamSearchParams, SamplingParams

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3,"]


@pytest.fixture
def llm(tiny_llama):
    return make_llm(tiny_llama)


def _run(llm, params_list):
    engine = llm.llm_engine
    for i, params in enumerate(params_list):
        engine.add_request(f"r{i}", PROMPTS[i % len(PROMPTS)], params)
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    return [finals[f"r{i}"] for i in range(len(params_list))]


def _baseline(llm, n=3):
    return [o.outputs[0].token_ids for o in _run(llm, [greedy(8) for _ in range(n)])]


def _bad(max_tokens=8):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, seed=BAD_SEED)


def test_a_sampler_fault_ends_only_its_request(llm, monkeypatch):
    expected = _baseline(llm)
    engine = llm.llm_engine
    free = engine.block_manager.num_free_blocks
    handler = engine.generation_handler
    real = handler.sampler

    monkeypatch.setattr(handler, "sampler", faulty_sampler(real))
    outs = _run(llm, [greedy(8), _bad(), greedy(8)])
    assert outs[1].outputs[0].finish_reason == "error"
    assert [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids] == [expected[0],
                                                                            expected[2]]
    assert all(o.outputs[0].finish_reason == "length" for o in (outs[0], outs[2]))
    assert engine.block_manager.num_free_blocks == free
    assert not engine.has_unfinished_requests()
    monkeypatch.setattr(handler, "sampler", real)
    assert _baseline(llm) == expected  # and it keeps serving


def test_a_detokenizer_fault_ends_only_its_request(llm, monkeypatch):
    expected = _baseline(llm)
    free = llm.llm_engine.block_manager.num_free_blocks
    real_add = IncrementalDetokenizer.add

    def add(self, token_id, check_stops=True):
        if self.params.seed == BAD_SEED:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected detokenizer fault")
        return real_add(self, token_id, check_stops)

    monkeypatch.setattr(IncrementalDetokenizer, "add", add)
    outs = _run(llm, [_bad(), greedy(8), greedy(8)])
    assert outs[0].outputs[0].finish_reason == "error"
    assert [o.outputs[0].token_ids for o in outs[1:]] == expected[1:]
    assert llm.llm_engine.block_manager.num_free_blocks == free


def test_n_samples_of_a_failing_request_all_report_the_error(llm, monkeypatch):
    engine = llm.llm_engine
    real = engine.generation_handler.sampler

    def sampler(logits, rows):
        if any(r.params.seed == BAD_SEED and r.output_ids for r in rows):
            raise RuntimeError("injected fault on the second token")
        return real(logits, rows)

    monkeypatch.setattr(engine.generation_handler, "sampler", sampler)
    bad = SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=BAD_SEED)
    outs = _run(llm, [greedy(8), bad])
    assert [c.finish_reason for c in outs[1].outputs] == ["error"] * 3
    assert outs[0].outputs[0].finish_reason == "length"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_an_output_fault_ends_only_its_request(llm, monkeypatch):
    expected = _baseline(llm)
    engine = llm.llm_engine
    real = engine.outputs.make_output

    def make_output(req):
        if req.params.seed == BAD_SEED:
            raise KeyError("injected output fault")
        return real(req)

    monkeypatch.setattr(engine.outputs, "make_output", make_output)
    outs = _run(llm, [greedy(8), greedy(8), _bad()])
    assert outs[2].outputs[0].finish_reason == "error"
    assert [o.outputs[0].token_ids for o in outs[:2]] == expected[:2]


def test_a_beam_step_fault_ends_only_its_search(llm, monkeypatch):
    from workbench.engine.requests import beam_search

    engine = llm.llm_engine
    real = beam_search.BeamSearch.advance

    def advance(self, *args):
        if self.params.max_tokens == 7:  # the marked search
            raise IndexError("injected beam fault")
        return real(self, *args)

    monkeypatch.setattr(beam_search.BeamSearch, "advance", advance)
    finals = {}
    engine.add_beam_request("bad", PROMPTS[0], BeamSearchParams(beam_width=2, max_tokens=7),
                            on_output=lambda o: finals.setdefault("bad", o))
    engine.add_beam_request("good", PROMPTS[1], BeamSearchParams(beam_width=2, max_tokens=6),
                            on_output=lambda o: finals.setdefault("good", o))
    engine.add_request("plain", PROMPTS[2], greedy(8))
    plain = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            plain = out if out.finished else plain
    assert finals["bad"].to_request_output().outputs[0].finish_reason == "error"
    assert all(len(s.tokens) > 0 for s in finals["good"].sequences)
    assert finals["good"].to_request_output().outputs[0].finish_reason != "error"
    assert plain.outputs[0].finish_reason == "length"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_failing_listener_aborts_its_request_only(llm):
    engine = llm.llm_engine

    def gone(_out):
        raise RuntimeError("Event loop is closed")

    engine.add_request("orphan", PROMPTS[0], greedy(8), on_output=gone)
    engine.add_request("alive", PROMPTS[1], greedy(8))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert [o.request_id for o in outs if o.finished] == ["alive"]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
