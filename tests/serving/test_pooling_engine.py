"""The pooling pipeline on the real engine (all-MiniLM-L6-v2, fp32): the failure paths a
fake engine can't show (an aborted request, a client that goes away)."""

from __future__ import annotations

import asyncio

import pytest

from workbench.serving import RequestMeta, ServerConfig, Servings
from workbench.serving.pooling.base import MISSING_RESULTS
from workbench.serving.protocol.pooling import EmbeddingCompletionRequest

pytestmark = pytest.mark.slow
LONG = "word " * 250  # ~250 tokens: each request takes a while on the CPU


@pytest.fixture(scope="module")
def engine():
    from workbench.config import EngineConfig
    from workbench.engine.async_engine import AsyncLLMEngine

    engine = AsyncLLMEngine.from_config(EngineConfig(model="all-minilm-l6-v2", dtype="float32",
                                                     max_num_seqs=1))
    yield engine
    engine.shutdown()


async def _wait_for(engine, request_id: str) -> None:
    """Until the engine holds `request_id` (plus the random suffix engine ids carry)."""
    while not any(r.startswith(f"{request_id}-") for r in list(engine.engine.requests)):
        await asyncio.sleep(0.001)


def test_an_aborted_request_fails_the_batch(engine):
    serving = Servings.build(engine, ServerConfig()).embeddings
    request = EmbeddingCompletionRequest(input=[LONG] * 12)
    meta = RequestMeta(headers={"x-request-id": "abort-me"})

    async def go():
        task = asyncio.ensure_future(serving.create(request, meta))
        while True:  # under the engine's lock no step runs: the request is still queued
            with engine.engine.lock:
                waiting = [s.request.request_id for s in engine.engine.scheduler.waiting
                           if s.request.request_id.startswith("embd-abort-me-")]
                if waiting:  # e.g. an operator's abort, before it ran
                    engine.engine.abort_request(waiting[-1])
                    break
            await asyncio.sleep(0.001)
        return await task

    with pytest.raises(ValueError, match=f"^{MISSING_RESULTS}$"):
        asyncio.run(go())
    assert not engine.engine.requests  # the other eleven finished, nothing left behind


def test_cancelling_the_handler_aborts_its_requests(engine):
    serving = Servings.build(engine, ServerConfig()).embeddings
    request = EmbeddingCompletionRequest(input=[LONG] * 4)
    meta = RequestMeta(headers={"x-request-id": "gone"})

    async def go():
        task = asyncio.ensure_future(serving.create(request, meta))
        await _wait_for(engine, "embd-gone-3")
        task.cancel()  # what a client disconnect does to the HTTP handler
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(2000):
            if not engine.engine.requests:
                return True
            await asyncio.sleep(0.005)
        return False

    assert asyncio.run(go()), f"left running: {list(engine.engine.requests)}"
