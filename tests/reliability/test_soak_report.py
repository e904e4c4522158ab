"""`SoakReport` bookkeeping and the `workbench bench --soak` wiring (the run itself is
exercised by test_disconnect_storm.py and test_fuzz.py)."""

from __future__ import annotations

import json

from workbench import bench, soak
from workbench.soak import SoakReport


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
