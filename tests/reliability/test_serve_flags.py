"""The limit and security flags of `workbench serve` reach the ServerConfig."""

from __future__ import annotations

import pytest

from workbench.apps.cli import build_parser, configs_from_args


def _server(argv, monkeypatch, env=None):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    return configs_from_args(build_parser().parse_args(["serve", *argv]))[1]


def test_defaults(monkeypatch):
    server = _server([], monkeypatch)
    assert server.api_keys == () and server.api_key_exempt == ("health", "metrics")
    assert server.max_request_body_bytes == 8 * 2**20
    assert server.max_waiting_requests is None and server.request_timeout is None
    assert server.shutdown_timeout == 10.0


def test_flags_reach_the_server_config(monkeypatch):
    server = _server(["--api-key", "k1", "k2", "--api-key-exempt", "--max-request-body-bytes",
                      "1000", "--max-waiting-requests", "8", "--request-timeout", "2.5",
                      "--shutdown-timeout", "30"], monkeypatch)
    assert server.api_keys == ("k1", "k2") and server.api_key_exempt == ()
    assert (server.max_request_body_bytes, server.max_waiting_requests) == (1000, 8)
    assert (server.request_timeout, server.shutdown_timeout) == (2.5, 30.0)


def test_the_key_may_come_from_vllm_api_key_and_the_flag_wins(monkeypatch):
    assert _server([], monkeypatch, {"VLLM_API_KEY": "from-env"}).api_keys == ("from-env",)
    assert _server(["--api-key", "flag"], monkeypatch,
                   {"VLLM_API_KEY": "from-env"}).api_keys == ("flag",)


@pytest.mark.parametrize("flag", ["--max-waiting-requests=0", "--request-timeout=-1",
                                  "--max-request-body-bytes=0"])
def test_non_positive_limits_are_refused_by_name(monkeypatch, flag):
    with pytest.raises(ValueError, match=flag.split("=")[0].lstrip("-").replace("-", "_")):
        _server([flag], monkeypatch)
