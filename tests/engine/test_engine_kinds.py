"""Each request's kind handler is chosen when it is added, and the step only calls handlers.

Generation, beam search and pooling requests stepped together in one engine give what each
gives alone (tiny random llama, float32); each handler sees only its own requests' sequences.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.helpers import greedy, make_llm
from workbench.engine.handlers import BeamHandler, GenerationHandler, PoolingHandler
from workbench.pooling_params import PoolingParams
from workbench.sampling_params import BeamSearchParams, SamplingParams

PROMPTS = ["Once upon a time there was", "Hello", "The capital of France is"]
BEAM = BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True)
SAMPLED = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)


@pytest.fixture
def engine(tiny_llama):
    return make_llm(tiny_llama).llm_engine


def _add_all(engine, outs: dict) -> None:
    """One request of every kind, each reporting into `outs` by its id."""
    def keep(out):
        if out.finished:
            outs[out.request_id] = out

    engine.add_request("greedy", PROMPTS[0], greedy(6, ignore_eos=True), on_output=keep)
    engine.add_request("sampled", PROMPTS[1], SAMPLED, on_output=keep)
    engine.add_beam_request("beam", PROMPTS[2], BEAM, on_output=keep)
    engine.add_pooling_request("embed", PROMPTS[0], PoolingParams(task="embed"), on_output=keep)
    engine.add_pooling_request("classify", PROMPTS[1], PoolingParams(task="classify"),
                               on_output=keep)


def _run_all(engine) -> None:
    while engine.has_unfinished_requests():
        engine.step()


def test_each_kind_gets_its_handler_when_added(engine):
    reqs = {
        "gen": engine.add_request("gen", PROMPTS[0], greedy(2)),
        "beam": engine.add_beam_request("beam", PROMPTS[0], BeamSearchParams(2, 2)),
        "pool": engine.add_pooling_request("pool", PROMPTS[0], PoolingParams(task="embed")),
    }
    assert [r.kind for r in reqs.values()] == ["generate", "beam", "pool"]
    assert isinstance(engine.handlers["generate"], GenerationHandler)
    assert isinstance(engine.handlers["beam"], BeamHandler)
    assert isinstance(engine.handlers["pool"], PoolingHandler)
    assert [engine.handlers[r.kind] for r in reqs.values()] == [
        engine.generation_handler, engine.beam_handler, engine.pooling_handler]
    _run_all(engine)


def test_each_handler_computes_only_its_own_requests(engine, monkeypatch):
    seen: dict[str, set[str]] = {}
    for name in ("generation_handler", "beam_handler", "pooling_handler"):
        handler = getattr(engine, name)
        real = handler.compute

        def spy(batch, rows, results, real=real, name=name):
            seen.setdefault(name, set()).update(s.request.request_id for s, _ in batch)
            return real(batch, rows, results)

        monkeypatch.setattr(handler, "compute", spy)
    _add_all(engine, {})
    _run_all(engine)
    assert seen == {"generation_handler": {"greedy", "sampled"}, "beam_handler": {"beam"},
                    "pooling_handler": {"embed", "classify"}}


def test_mixed_kinds_in_one_step_give_what_each_gives_alone(tiny_llama):
    mixed = make_llm(tiny_llama).llm_engine
    steps, execute = [], mixed.runner.execute

    def record(out):
        steps.append({s.seq.request.request_id for s in out.scheduled})
        return execute(out)

    mixed.runner.execute = record
    together: dict = {}
    _add_all(mixed, together)
    _run_all(mixed)
    assert steps[0] == {"greedy", "sampled", "beam", "embed", "classify"}  # all in one step
    assert mixed.block_manager.num_free_blocks == mixed.block_manager.num_blocks

    alone = {}
    for rid in together:
        engine = make_llm(tiny_llama).llm_engine
        got: dict = {}
        _add_all(engine, got)
        engine.abort_request([other for other in together if other != rid])
        _run_all(engine)
        alone[rid] = got[rid]
    for rid in ("greedy", "sampled"):
        assert ([(c.index, c.token_ids) for c in together[rid].outputs]
                == [(c.index, c.token_ids) for c in alone[rid].outputs])
    assert ([s.tokens for s in together["beam"].sequences]
            == [s.tokens for s in alone["beam"].sequences])
    for rid in ("embed", "classify"):
        assert together[rid].finish_reason == alone[rid].finish_reason == "stop"
        torch.testing.assert_close(together[rid].outputs.data, alone[rid].outputs.data,
                                   atol=1e-5, rtol=1e-5)
