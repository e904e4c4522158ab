"""Issue 16 item 7: the holes in the input guards, each closed.

A byte-order mark (or a UTF-16 body) in front of the JSON must not slip past the body guard;
stop strings, LoRA names, `/detokenize` ids and `user` messages are refused by name; a 400
answered by the generic exception handler is counted as a 400 in `/metrics`.
"""

from __future__ import annotations

import pytest

JSON = {"content-type": "application/json"}
BOM = b"\xef\xbb\xbf"


@pytest.fixture
def http(tiny_http):  # a server on the tiny llama (tests/http/conftest.py)
    return tiny_http


def _post(http, path: str, text: str, prefix: bytes = BOM):
    return http.post(path, content=prefix + text.encode("utf-8", "surrogatepass"), headers=JSON)


@pytest.mark.parametrize("body, where", [
    ('{"prompt": "a\\ud800b", "max_tokens": 2}', "body.prompt"),
    ('{"prompt": "hi", "max_tokens": 2, "stop": ["\\ud83d"]}', "body.stop.0"),
    ('{"prompt": "hi", "max_tokens": 2, "request_id": "x\\udc00"}', "body.request_id"),
    ('{"prompt": "hi", "max_tokens": 2, "x": ' + "[" * 900 + "]" * 900 + "}", "body"),
])
def test_a_bom_does_not_hide_a_body_from_the_guard(http, body, where):
    r = _post(http, "/v1/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(where)


def test_a_bom_before_valid_json_is_still_served(http):
    r = _post(http, "/v1/completions", '{"prompt": "hi", "max_tokens": 2}')
    assert r.status_code == 200, r.text


def test_a_utf16_body_is_refused(http):
    body = '{"prompt": "a\\ud800b", "max_tokens": 2}'.encode("utf-16-le")
    r = http.post("/v1/completions", content=body, headers=JSON)
    assert r.status_code == 400
    assert "UTF-8" in r.json()["error"]["message"]


def test_a_stop_string_with_a_lone_surrogate_is_refused():
    from workbench import SamplingParams
    from workbench.errors import ValidationError

    with pytest.raises(ValidationError) as err:
        SamplingParams(stop=["ok", "\ud83d"])
    assert err.value.parameter == "stop"


def test_a_user_message_without_content_is_refused(http):
    r = http.post("/v1/chat/completions", json={"messages": [
        {"role": "system", "content": "be brief"}, {"role": "user"}], "max_tokens": 2})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "messages.1.content"
    assert "messages[1].content" in error["message"]


def test_an_assistant_message_without_content_is_accepted(http):
    r = http.post("/v1/chat/completions", json={"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
        {"role": "user", "content": "again"}], "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_detokenize_refuses_an_id_outside_the_vocabulary(http, tiny_server):
    vocab = tiny_server.engine.vocab_size
    assert http.post("/detokenize", json={"tokens": [1, 2]}).status_code == 200
    r = http.post("/detokenize", json={"tokens": [1, vocab]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tokens"
    assert f"Token id {vocab} is out of vocabulary" in r.json()["error"]["message"]


@pytest.mark.parametrize("name", ["good\nINFO forged log line", "x" * 100_000, ""])
def test_lora_names_are_checked(name):
    from workbench.serving.lora import valid_lora_name

    assert not valid_lora_name(name)
    assert valid_lora_name("pirate-v2.1")


def test_runtime_load_refuses_a_forged_name(tmp_path):
    from workbench.serving.errors import ServingError
    from workbench.serving.lora import ServedAdapters

    adapters = ServedAdapters(engine=None, base_model_names=["base"], allow_runtime=True,
                              load_dirs=[str(tmp_path)])
    with pytest.raises(ServingError) as err:
        adapters.load("a\nb", str(tmp_path / "a"))
    assert "lora_name" in err.value.response.error.message
    assert adapters.resolve("x" * 100_000) is None


def test_generic_handler_400_is_counted_as_400():
    """A ValueError raised by a route is answered 400 by the app's generic handler, outside
    the counting middleware; /metrics must count what the client got, not 500/unknown."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from prometheus_client import CollectorRegistry, generate_latest

    from workbench.http.errors import unexpected_error_handler
    from workbench.http.middleware import RequestCounterMiddleware

    registry = CollectorRegistry()
    app = FastAPI()

    @app.get("/boom")
    def boom():
        raise ValueError("bad value")

    app.add_exception_handler(Exception, unexpected_error_handler)
    app.add_middleware(RequestCounterMiddleware, registry=registry)
    r = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert r.status_code == 400
    text = generate_latest(registry).decode()
    assert 'status="400",type="BadRequestError"' in text
    assert 'status="500"' not in text
