"""The FastAPI app over the scripted fake engine: framing and failure paths, no model."""

from __future__ import annotations

import json
import logging

import pytest
from fastapi.testclient import TestClient

from tests.serving.conftest import FakeEngine, tokenizer  # noqa: F401 - fixture
from workbench.errors import EngineDeadError
from workbench.http.app import build_app


@pytest.fixture
def engine(tokenizer):  # noqa: F811 - the imported fixture, by name
    return FakeEngine(tokenizer)


@pytest.fixture
def app_client(engine):
    with TestClient(build_app(engine)) as c:
        yield c


def sse_payloads(response) -> list[str]:
    assert response.headers["content-type"].startswith("text/event-stream")
    events = response.text.split("\n\n")
    assert events[-1] == "" and all(e.startswith("data: ") for e in events[:-1])
    return [e.removeprefix("data: ") for e in events[:-1]]


def test_sse_framing_ends_with_done(app_client):
    r = app_client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "stream": True})
    payloads = sse_payloads(r)
    assert payloads[-1] == "[DONE]"
    assert [json.loads(p)["choices"][0]["text"] for p in payloads[:-1]] == ["Hello", " world"]


def test_engine_error_mid_stream_is_an_error_event_then_done(app_client, engine):
    engine.fail_at = 1
    r = app_client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True})
    assert r.status_code == 200
    payloads = sse_payloads(r)
    assert json.loads(payloads[-2])["error"]["type"] == "InternalServerError"
    assert payloads[-1] == "[DONE]"


def test_engine_error_without_stream_is_500(app_client, engine, caplog):
    engine.fail_at = 0
    with caplog.at_level(logging.ERROR, logger="workbench.serving"):
        r = app_client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4})
    assert r.status_code == 500
    error = r.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("InternalServerError", None, 500)
    assert error["message"] == "Internal server error"  # vLLM's words; the log names it
    assert any(rec.getMessage().startswith("Request cmpl-") and rec.getMessage().endswith(
        "failed with an internal error during generation") for rec in caplog.records)


def test_health_is_503_once_the_engine_died(app_client, engine):
    assert app_client.get("/health").status_code == 200

    def dead():
        raise EngineDeadError("loop stopped")

    engine.check_health = dead
    assert app_client.get("/health").status_code == 503


def test_validation_errors_are_never_422(app_client):
    r = app_client.post("/v1/completions", json={"prompt": "Hi", "n": "many"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "body.n"
    assert ("'loc': 'body.n', 'msg': 'Input should be a valid integer"
            in r.json()["error"]["message"])
