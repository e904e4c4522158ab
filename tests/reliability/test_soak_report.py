"""`SoakReport` bookkeeping and the `workbench bench --soak` wiring (the run itself is
exercised by test_disconnect_storm.py and test_fuzz.py)."""

from __future__ import annotations

import json

from workbench.apps import bench, soak
from workbench.apps.soak import SoakReport


def test_statuses_are_counted_by_class():
    report = SoakReport()
    for status in (200, 201, 400, 413, 503, 500):
        report.count(status)
    assert (report.requests_sent, report.status_2xx, report.status_4xx, report.status_5xx) == (
        6, 2, 2, 2)
    assert not report.ok


def test_a_leak_or_hang_fails_the_report():
    assert SoakReport().ok
    assert not SoakReport(blocks_leaked=1).ok
    assert not SoakReport(hangs=1).ok
    assert not SoakReport(stuck_requests=1).ok


def test_bench_soak_prints_the_figures_and_one_json_line(monkeypatch, capsys):
    seen = {}

    def fake_run(**kwargs):
        seen.update(kwargs)
        report = SoakReport(rss_before_mb=400.0, rss_after_mb=401.0)
        report.count(200)
        report.count(400)
        return report

    monkeypatch.setattr(soak, "run_soak", fake_run)
    assert bench.main(["--soak", "--quick", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    figures = json.loads(out[-1])
    assert figures["soak_requests_sent"] == 2 and figures["soak_status_5xx"] == 0
    assert figures["soak_ok"] is True
    assert any(line.startswith("KV blocks leaked") for line in out)
    assert seen["rounds"] == 2  # --quick


def test_bench_soak_exits_non_zero_on_a_5xx(monkeypatch, capsys):
    def fake_run(**kwargs):
        report = SoakReport()
        report.count(500)
        return report

    monkeypatch.setattr(soak, "run_soak", fake_run)
    assert bench.main(["--soak"]) == 1


def test_the_new_checks_fail_the_report():
    assert not SoakReport(health_max_ms=1500).ok
    assert not SoakReport(burst_limit=64, burst_peak_waiting=65).ok
    assert not SoakReport(shutdown_streams=2, shutdown_clean=1).ok
    assert not SoakReport(shutdown_timeout=1, shutdown_limit_s=2, shutdown_s=2.5).ok
    assert SoakReport(health_max_ms=20, burst_limit=64, burst_peak_waiting=64, shutdown_streams=2,
                      shutdown_clean=2, shutdown_timeout=1, shutdown_limit_s=2, shutdown_s=1.2).ok


def test_burst_latency_and_shutdown_checks_against_a_live_server(make_server, slow_steps):
    import asyncio

    from workbench.apps import soak_checks

    server = make_server(engine={"max_num_seqs": 4})
    slow_steps(server, 0.02)
    report = SoakReport()

    async def huge_prompts_while_watched():
        stop = asyncio.Event()
        watcher = asyncio.create_task(soak_checks.health_latency(server.url, stop, report))
        await soak_checks.huge_prompts(server.url, count=2)
        stop.set()
        await watcher

    asyncio.run(huge_prompts_while_watched())
    asyncio.run(soak_checks.burst(server.url, server.engine, report, requests=120, limit=16))
    assert report.burst_requests == 120 and report.burst_503 > 0
    assert report.burst_peak_waiting <= 16 and server.engine.max_waiting_requests is None
    assert 0 < report.health_max_ms < 1000
    # the bench allows 1 s after the deadline; a shared CI machine gets 3 (the cut itself is
    # shown by every stream's error event)
    soak_checks.shutdown(server, report, streams=2, timeout=0.5, max_tokens=100, slack=3)
    assert report.shutdown_clean == report.shutdown_streams == 2
    assert report.shutdown_limit_s == 3.5 and report.ok, report
