"""AsyncLLMEngine: outputs as an async generator, aborts on cancel/abandon, failures isolated."""

import asyncio
import gc
import time

import pytest

from tests.engine.helpers import greedy, make_llm
from workbench.engine.async_engine import AsyncLLMEngine
from workbench.errors import ValidationError
from workbench.sampling_params import RequestOutputKind, SamplingParams

PROMPT = "Once upon a time"
BLOCKS = 256
LONG = 1000  # tokens of a stream that the test cuts short


@pytest.fixture()
def llm(tiny_llama):
    return make_llm(tiny_llama, max_model_len=1024, block_size=4, num_kv_blocks=BLOCKS)


@pytest.fixture()
def engine(llm):
    async_engine = AsyncLLMEngine.from_llm(llm)
    yield async_engine
    async_engine.shutdown()


async def wait_until(condition, timeout: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def idle(engine: AsyncLLMEngine):
    """True once the engine holds no request and every KV block is free."""
    inner = engine.engine
    return lambda: (not inner.has_unfinished_requests()
                    and inner.block_manager.num_free_blocks == BLOCKS)


def spy_aborts(monkeypatch, engine: AsyncLLMEngine) -> list:
    """Records the ids passed to the inner engine's abort_request (which still runs)."""
    seen, real = [], engine.engine.abort_request

    def abort_request(request_id):
        seen.append(request_id)
        real(request_id)

    monkeypatch.setattr(engine.engine, "abort_request", abort_request)
    return seen


def aborted_early(engine, aborts, rid) -> bool:
    """`rid` was aborted, long before its LONG tokens."""
    return rid in aborts and engine.engine.generation_tokens_total < LONG // 2


@pytest.fixture()
def slow_steps(engine, monkeypatch):
    """Each model step takes at least 2 ms: a LONG stream lasts seconds, so a cut-short one
    can't finish by itself before the test's abort arrives, however fast the tiny model is."""
    real = engine.engine.runner.execute

    def execute(out):
        time.sleep(0.002)
        return real(out)

    monkeypatch.setattr(engine.engine.runner, "execute", execute)


async def collect(engine, prompt, params, rid):
    return [out async for out in engine.generate(prompt, params, rid)]


def long_stream() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=LONG, ignore_eos=True)


async def test_generate_streams_to_the_same_tokens_as_the_sync_llm(llm, engine):
    want = llm.generate(PROMPT, greedy(10))[0].outputs[0].token_ids
    outs = await collect(engine, PROMPT, greedy(10), "r1")
    assert len(outs) == 10 and outs[-1].finished and not outs[0].finished
    assert outs[-1].outputs[0].token_ids == want


async def test_concurrent_requests_each_get_their_own_outputs(llm, engine):
    prompts = ["Hello", "The weather today is", PROMPT]
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(8))]
    results = await asyncio.gather(*(collect(engine, p, greedy(8), f"c{i}")
                                     for i, p in enumerate(prompts)))
    assert [r[-1].request_id for r in results] == ["c0", "c1", "c2"]
    assert [r[-1].outputs[0].token_ids for r in results] == want


async def test_delta_outputs_concatenate(engine):
    params = SamplingParams(temperature=0.0, max_tokens=10, output_kind=RequestOutputKind.DELTA)
    deltas = await collect(engine, PROMPT, params, "d")
    full = await collect(engine, PROMPT, greedy(10), "full")
    assert "".join(d.outputs[0].text for d in deltas) == full[-1].outputs[0].text


async def test_a_cancelled_consumer_aborts_its_request(engine, monkeypatch, slow_steps):
    aborts = spy_aborts(monkeypatch, engine)
    started = asyncio.Event()

    async def consume():
        async for _ in engine.generate(PROMPT, long_stream(), "cancel-me"):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_until(idle(engine))
    assert aborted_early(engine, aborts, "cancel-me")


async def test_an_abandoned_generator_aborts_its_request(engine, monkeypatch, slow_steps):
    aborts = spy_aborts(monkeypatch, engine)
    async for _ in engine.generate(PROMPT, long_stream(), "abandon-me"):
        break  # the generator is dropped: its finalizer closes it
    gc.collect()
    assert await wait_until(idle(engine))
    assert aborted_early(engine, aborts, "abandon-me")


async def test_closing_the_generator_early_aborts_its_request(engine, monkeypatch, slow_steps):
    aborts = spy_aborts(monkeypatch, engine)
    stream = engine.generate(PROMPT, long_stream(), "close-me")
    await stream.__anext__()
    await stream.aclose()
    assert await wait_until(idle(engine))
    assert aborted_early(engine, aborts, "close-me")


async def test_abort_ends_the_stream_with_finish_reason_abort(engine, slow_steps):
    seen = []
    async for out in engine.generate(PROMPT, long_stream(), "abort-me"):
        seen.append(out)
        if len(seen) == 2:
            await engine.abort("abort-me")
    assert seen[-1].finished and seen[-1].outputs[0].finish_reason == "abort"
    assert len(seen[-1].outputs[0].token_ids) < LONG // 2
    assert await wait_until(idle(engine))


async def test_an_invalid_request_raises_a_validation_error(engine):
    with pytest.raises(ValidationError) as info:
        await collect(engine, {"prompt_token_ids": []}, greedy(4), "bad")
    assert info.value.parameter == "prompt"
    assert (await collect(engine, PROMPT, greedy(2), "good"))[-1].finished


async def test_a_model_failure_errors_the_request_and_the_engine_goes_on(llm, engine, monkeypatch):
    want = llm.generate(PROMPT, greedy(6))[0].outputs[0].token_ids
    real = engine.engine.runner.execute
    calls = {"n": 0}

    def execute(out):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("simulated kernel failure")
        return real(out)

    monkeypatch.setattr(engine.engine.runner, "execute", execute)
    failed = await collect(engine, PROMPT, greedy(6), "fails")
    assert failed[-1].finished and failed[-1].outputs[0].finish_reason == "error"
    later = await collect(engine, PROMPT, greedy(6), "later")
    assert later[-1].outputs[0].token_ids == want
    engine.check_health()


async def test_the_event_loop_stays_responsive_while_the_engine_steps(engine, slow_steps):
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.001)
            ticks += 1

    tick_task = asyncio.create_task(ticker())
    outs = await collect(engine, PROMPT, greedy(20, ignore_eos=True), "busy")
    tick_task.cancel()
    assert outs[-1].finished
    assert ticks >= 5


async def test_two_async_engines_coexist(tiny_qwen2, llm, engine):
    other_llm = make_llm(tiny_qwen2, block_size=4, num_kv_blocks=BLOCKS)
    other = AsyncLLMEngine.from_llm(other_llm)
    try:
        want_a = llm.generate(PROMPT, greedy(8))[0].outputs[0].token_ids
        want_b = other_llm.generate(PROMPT, greedy(8))[0].outputs[0].token_ids
        a, b = await asyncio.gather(collect(engine, PROMPT, greedy(8), "same-id"),
                                    collect(other, PROMPT, greedy(8), "same-id"))
        assert want_a != want_b
        assert (a[-1].outputs[0].token_ids, b[-1].outputs[0].token_ids) == (want_a, want_b)
    finally:
        other.shutdown()


async def test_a_bug_in_the_step_loop_fails_every_stream_and_marks_the_engine_dead(engine,
                                                                                  monkeypatch):
    from workbench.errors import EngineDeadError

    def broken():
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(engine.engine.scheduler, "schedule", broken)
    with pytest.raises(EngineDeadError, match="scheduler bug"):
        await collect(engine, PROMPT, greedy(4), "doomed")
    with pytest.raises(EngineDeadError):
        engine.check_health()
    with pytest.raises(EngineDeadError):
        await collect(engine, PROMPT, greedy(4), "after")
