"""Beam search inside the engine: KV sharing, batching with ordinary requests, blocks, abort,
errors, the async API, and the tree matching the returned sequences (tiny random llama)."""

from __future__ import annotations

import asyncio

import pytest

from tests.engine.helpers import greedy, make_llm
from workbench.engine.async_engine import AsyncLLMEngine
from workbench.engine.requests.beam_search import beam_score
from workbench.errors import ValidationError
from workbench.sampling_params import BeamSearchParams

PROMPT = "Once upon a time there was"


@pytest.fixture
def llm(tiny_llama):
    return make_llm(tiny_llama)


def _record_steps(llm):
    """Wraps the runner so each step's scheduled (sequence id, token count) pairs are kept."""
    steps, runner = [], llm.llm_engine.runner
    execute = runner.execute

    def spy(out):
        steps.append([(s.seq.request.request_id, s.num_tokens) for s in out.scheduled])
        return execute(out)

    runner.execute = spy
    return steps


def test_prompt_computed_once_and_beams_decode_one_token_each(llm, tiny_llama):
    steps = _record_steps(llm)
    n = len(tiny_llama.tokenizer(PROMPT)["input_ids"])
    llm.beam_search(PROMPT, BeamSearchParams(beam_width=4, max_tokens=5, ignore_eos=True))
    assert steps[0] == [("beam-0", n)]
    assert all(counts == [("beam-0", 1)] * 4 for counts in steps[1:])
    assert len(steps) == 5


def test_all_blocks_free_after_a_search(llm):
    bm = llm.llm_engine.block_manager
    llm.beam_search([PROMPT, "Hello"], BeamSearchParams(beam_width=4, max_tokens=40))
    assert bm.num_free_blocks == bm.num_blocks
    assert not llm.llm_engine.requests and not llm.llm_engine.scheduler.running


def test_beams_share_the_prompt_blocks(llm):
    engine = llm.llm_engine
    engine.add_beam_request("b", "word " * 40, BeamSearchParams(beam_width=4, max_tokens=3))
    engine.step()  # the prompt
    engine.step()  # the first decode of 4 beams
    beams = engine.requests["b"].sequences
    assert len(beams) == 4
    full = len(beams[0].token_ids) // engine.block_manager.block_size
    assert full >= 2 and all(b.block_table[:full - 1] == beams[0].block_table[:full - 1]
                             for b in beams)
    while engine.has_unfinished_requests():
        engine.step()


def test_beams_batch_with_ordinary_requests_in_one_step(llm):
    engine, steps = llm.llm_engine, _record_steps(llm)
    engine.add_request("plain", "Hello", greedy(6))
    engine.add_beam_request("beam", PROMPT, BeamSearchParams(beam_width=2, max_tokens=6))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert any({"plain", "beam"} <= {rid for rid, _ in step} for step in steps)
    beam = next(o for o in outs if o.request_id == "beam")
    alone = make_llm(llm.llm_engine.loaded).beam_search(PROMPT, BeamSearchParams(2, 6))[0]
    assert [s.tokens for s in beam.sequences] == [s.tokens for s in alone.sequences]


def test_tree_reproduces_returned_sequences_and_scores(llm, tiny_llama):
    eos = tiny_llama.tokenizer.eos_token_id
    out = llm.beam_search(PROMPT, BeamSearchParams(beam_width=3, max_tokens=8, length_penalty=0.5))[0]
    tree, n = out.tree, len(out.sequences[0].tokens) - 8
    assert len(tree) == 6 + 7 * 3 * 6 and tree.num_steps == 8
    for i, seq in enumerate(out.sequences):
        path = tree.path(i)
        assert [node.token_id for node in path] == seq.tokens[n:]
        assert path[-1].cum_logprob == pytest.approx(seq.cum_logprob)
        assert path[-1].score == pytest.approx(beam_score(seq.tokens, seq.cum_logprob, eos, 0.5))
        assert path[-1].returned == i and all(p.status == "kept" for p in path)
    assert tree.best is tree.path(0)[-1]
    for s in range(1, 8):  # exactly `width` candidates go on from each step
        assert sum(node.status == "kept" for node in tree.step(s)) == 3


def test_width_above_max_num_seqs_is_refused(tiny_llama):
    small = make_llm(tiny_llama, max_num_seqs=2)
    with pytest.raises(ValidationError, match="beam_width=4"):
        small.beam_search(PROMPT, BeamSearchParams(beam_width=4, max_tokens=4))


def test_search_survives_a_tight_kv_cache(tiny_llama):
    """Beams preempted for want of blocks are recomputed; the result does not change."""
    tight = make_llm(tiny_llama, num_kv_blocks=10, block_size=4, max_model_len=40)
    params = BeamSearchParams(beam_width=4, max_tokens=24, ignore_eos=True)
    out = tight.beam_search(["word " * 12], params)[0]
    roomy = make_llm(tiny_llama, max_model_len=40).beam_search(["word " * 12], params)[0]
    assert [s.tokens for s in out.sequences] == [s.tokens for s in roomy.sequences]
    assert tight.llm_engine.stats().num_preemptions > 0
    assert tight.llm_engine.block_manager.num_free_blocks == 10


def test_abort_ends_the_search_with_abort(llm):
    engine = llm.llm_engine
    got = []
    engine.add_beam_request("b", PROMPT, BeamSearchParams(beam_width=2, max_tokens=50),
                            on_output=got.append)
    engine.step()
    engine.step()
    engine.abort_request("b")
    engine.step()
    assert len(got) == 1 and got[0].finished
    assert {s.finish_reason for s in got[0].sequences} == {"abort"}
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_model_error_gives_a_single_error_output(llm):
    engine = llm.llm_engine
    got = []
    engine.add_beam_request("b", PROMPT, BeamSearchParams(beam_width=2, max_tokens=5),
                            on_output=got.append)
    engine.step()

    def boom(out):
        raise RuntimeError("model failed")

    engine.runner.execute = boom
    engine.step()
    assert len(got) == 1 and len(got[0].sequences) == 1
    assert got[0].sequences[0].finish_reason == "error"


def test_async_beam_search_yields_the_final_output(llm):
    engine = AsyncLLMEngine.from_llm(llm)
    params = BeamSearchParams(beam_width=2, max_tokens=5)

    async def run():
        return [o async for o in engine.beam_search(PROMPT, "a", params)]

    try:
        outs = asyncio.run(run())
    finally:
        engine.shutdown()
    expected = llm.beam_search(PROMPT, params)[0]
    assert len(outs) == 1 and outs[0].request_id == "a"
    assert [s.tokens for s in outs[0].sequences] == [s.tokens for s in expected.sequences]
