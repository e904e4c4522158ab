"""Disconnect storms: 64 streaming clients at once, half of them leaving at random points,
several rounds: no request stays in the engine, every KV block comes back, memory stays flat."""

from __future__ import annotations

import asyncio

import pytest

from workbench.apps.soak import INVALID_BODIES, SoakReport, engine_leaks, rss_mb, storm


@pytest.mark.slow
async def test_disconnect_storms_leak_nothing(make_server):
    server = make_server(engine={"num_kv_blocks": 512, "max_num_seqs": 32})
    engine = server.engine.engine
    start_free = engine.block_manager.num_free_blocks
    assert start_free == engine.block_manager.num_blocks
    await storm(server.url, clients=64, seed=0)  # warm-up: allocator and caches settle
    assert await asyncio.to_thread(engine_leaks, server.engine) == (0, 0)
    before = rss_mb()
    report = SoakReport()
    for round_ in range(4):
        await storm(server.url, clients=64, disconnect_fraction=0.5, seed=round_ + 1,
                    report=report)
        assert await asyncio.to_thread(engine_leaks, server.engine) == (0, 0), round_
        assert engine.block_manager.num_free_blocks == start_free
    growth = rss_mb() - before
    assert report.failures == [] and report.hangs == 0 and report.status_5xx == 0
    assert report.disconnects >= 4 * 64 // 4  # about half of them left early
    assert report.status_2xx + report.disconnects >= 4 * 64  # unstreamed leavers get none
    assert report.status_4xx == 4 * len(INVALID_BODIES)  # the invalid bodies, nothing else
    assert growth < 100, f"RSS grew by {growth:.0f} MB over four storms"
    assert engine.stats().num_running == 0 and engine.stats().num_waiting == 0
