"""`workbench serve --responses-store-size` reaches the server config and the app's store."""

from __future__ import annotations

import pytest

from tests.http.test_cli import run_serve


def test_store_size_flag(monkeypatch):
    assert run_serve(monkeypatch)["server"].responses_store_size == 1000
    got = run_serve(monkeypatch, "--responses-store-size", "0")
    assert got["server"].responses_store_size == 0


def test_a_negative_store_size_stops_at_start_up(monkeypatch, capsys):
    monkeypatch.setattr("workbench.http.server.run_server", lambda *a, **k: 0)
    from workbench.apps import cli

    with pytest.raises(SystemExit):
        cli.main(["serve", "--responses-store-size", "-1"])
    assert "responses_store_size must be non-negative" in capsys.readouterr().err
