"""Many clients at once, some hanging up: the rest complete, the engine ends idle."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.http.conftest import MODEL

pytestmark = pytest.mark.slow

TOPICS = ["the sea", "a robot", "the moon", "a library", "winter", "a dragon", "a city", "music"]


async def wait_idle(llm, timeout: float = 20.0) -> None:
    engine = llm.llm_engine
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.stats()
        if not engine.requests and stats.num_running == 0 and stats.num_waiting == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"engine still busy: {engine.stats()}")


async def one_client(aclient, i: int, hang_up: bool) -> dict | None:
    stream = await aclient.completions.create(
        model=MODEL, prompt=f"A short story about {TOPICS[i % len(TOPICS)]}:", max_tokens=8,
        temperature=0.8, seed=i, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    chunks = []
    async for chunk in stream:
        chunks.append(chunk)
        if hang_up and len(chunks) == 2:
            await stream.close()
            return None
    return {"text": "".join(c.choices[0].text for c in chunks if c.choices),
            "finish": [c.choices[0].finish_reason for c in chunks if c.choices][-1],
            "usage": chunks[-1].usage}


async def test_32_streaming_clients_some_disconnecting(aclient, llm):
    hang_ups = {i for i in range(32) if i % 4 == 3}
    results = await asyncio.gather(*(one_client(aclient, i, i in hang_ups) for i in range(32)))
    for i, result in enumerate(results):
        if i in hang_ups:
            assert result is None
            continue
        assert result["finish"] == "length" and result["text"]
        assert result["usage"].completion_tokens == 8
    await wait_idle(llm)


async def test_non_streaming_client_disconnect_aborts_the_request(server, llm):
    before = llm.llm_engine.generation_tokens_total
    async with httpx.AsyncClient(base_url=server.base_url, timeout=1.0) as http:
        with pytest.raises(httpx.TimeoutException):
            await http.post("/completions", json={"model": MODEL, "prompt": "Count:",
                                                  "max_tokens": 500, "ignore_eos": True})
    await wait_idle(llm)
    assert llm.llm_engine.generation_tokens_total - before < 500


async def test_streaming_client_disconnect_aborts_the_request(aclient, llm):
    before = llm.llm_engine.generation_tokens_total
    stream = await aclient.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to 1000."}], max_tokens=480,
        stream=True, extra_body={"ignore_eos": True})
    async for _ in stream:
        break
    await stream.close()
    await wait_idle(llm)
    assert llm.llm_engine.generation_tokens_total - before < 480
