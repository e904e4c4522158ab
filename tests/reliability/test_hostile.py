"""Hostile traffic against a live server on the tiny llama (loopback only, bounded loops).

Each test is one attack from issue 16 that used to hurt another client or the server:
a reused request id, a burst past `--max-waiting-requests`, CPU-heavy prompts and templates
on the event loop, grammars that eat memory or never match, oversized request heads (issue
28). The shutdown and tracing checks live in `test_shutdown.py` and
`tests/serving/test_tracing.py`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "ignore_eos": True}


async def _stream_reasons(client: httpx.AsyncClient, path: str, body: dict,
                          headers: dict | None = None) -> tuple[int, list, bool]:
    """Status, finish reasons and whether `[DONE]` came, of one streamed request."""
    reasons, done = [], False
    async with client.stream("POST", path, json={**body, "stream": True},
                             headers=headers or {}) as r:
        if r.status_code != 200:
            await r.aread()
            return r.status_code, [], False
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                reasons += [c.get("finish_reason") for c in event.get("choices", [])
                            if c.get("finish_reason")]
    return 200, reasons, done


# -- item 4: a reused request id never touches another client's request ------------------------

@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {**CHAT, "max_tokens": 40}),
    ("/v1/completions", {"prompt": "Once", "temperature": 0, "ignore_eos": True,
                         "max_tokens": 40}),
])
@pytest.mark.parametrize("where", ["header", "body"])
async def test_a_reused_request_id_leaves_the_running_request_alone(make_server, slow_steps,
                                                                    path, body, where):
    server = make_server()
    slow_steps(server, 0.02)
    headers, extra = ({"X-Request-Id": "same-id"}, {}) if where == "header" else (
        {}, {"request_id": "same-id"})
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        first = asyncio.create_task(_stream_reasons(client, path, {**body, **extra}, headers))
        await asyncio.to_thread(_wait_for, lambda: server.engine.stats().num_running >= 1)
        second = await _stream_reasons(client, path, {**body, **extra, "max_tokens": 3}, headers)
        first = await first
    assert second == (200, ["length"], True)
    assert first == (200, ["length"], True)  # not "abort" after a few chunks


async def test_a_reused_responses_request_id_does_not_overwrite_the_stored_response(make_server):
    server = make_server()
    body = {"input": "Hi", "max_output_tokens": 4, "temperature": 0, "request_id": "resp_mine"}
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        mine = await client.post("/v1/responses", json=body)
        assert mine.status_code == 200
        theirs = await client.post("/v1/responses", json={**body, "input": "Other"})
        stored = await client.get("/v1/responses/resp_mine")
    assert theirs.status_code == 400 and theirs.json()["error"]["param"] == "request_id"
    assert stored.json()["output"] == mine.json()["output"]


# -- item 5: admission under a burst --------------------------------------------------------------

def test_a_burst_past_max_waiting_requests_is_refused_with_503(make_server, slow_steps):
    server = make_server(engine={"max_num_seqs": 4}, max_waiting_requests=64)
    slow_steps(server, 0.05)
    peak = 0

    async def burst() -> list[int]:
        nonlocal peak
        limits = httpx.Limits(max_connections=300, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:
            async def one() -> int:
                r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})
                return r.status_code

            tasks = [asyncio.create_task(one()) for _ in range(300)]
            while not all(t.done() for t in tasks):
                peak = max(peak, server.engine.stats().num_waiting)
                await asyncio.sleep(0.005)
            return [t.result() for t in tasks]

    statuses = asyncio.run(burst())
    assert set(statuses) <= {200, 503}
    assert statuses.count(503) > 0
    assert peak <= 64


# -- item 2: CPU-heavy requests never stall the event loop ----------------------------------------

HEAVY_TEMPLATE = ("{% for i in range(9000) %}{% for j in range(9000) %}{% endfor %}{% endfor %}"
                  "{{ messages[0]['content'] }}")


def test_health_answers_within_a_second_while_huge_prompts_and_heavy_templates_run(make_server):
    server = make_server(trust_request_chat_template=True)
    server.app.state.servings.chat.renderer.render_timeout = 1.0
    huge = "hello world, a long prompt. " * 20000  # ~0.56 MB: about a second to tokenize

    async def attack() -> tuple[list[httpx.Response], float]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            heavy = [client.post("/v1/completions", json={"prompt": huge, "max_tokens": 1})
                     for _ in range(2)]
            heavy.append(client.post("/v1/chat/completions", json={
                **CHAT, "max_tokens": 1, "chat_template": HEAVY_TEMPLATE}))
            heavy.append(client.post("/tokenize", json={"prompt": huge}))
            heavy.append(client.post("/v1/validate", json={"prompt": huge, "max_tokens": 1}))
            tasks = [asyncio.create_task(h) for h in heavy]
            worst = 0.0
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as probe:
                while not all(t.done() for t in tasks):
                    start = time.perf_counter()
                    assert (await probe.get("/health")).status_code == 200
                    worst = max(worst, time.perf_counter() - start)
                    await asyncio.sleep(0.05)
            return [t.result() for t in tasks], worst

    responses, worst = asyncio.run(attack())
    assert worst < 1.0
    assert [r.status_code for r in responses] == [400, 400, 400, 200, 200]
    assert responses[2].json()["error"]["param"] == "chat_template"
    assert "took too long" in responses[2].json()["error"]["message"]


# -- item 3: grammars that eat memory or never match --------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_a_grammar_over_the_size_limit_is_a_400_naming_structured_outputs(make_server, stream):
    server = make_server()
    server.engine.engine.inputs.grammars.max_grammar_bytes = 1 << 20
    body = {**CHAT, "max_tokens": 4, "stream": stream,
            "structured_outputs": {"regex": "(x{100}){100}"}}  # ~5 MiB of lexer states
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "structured_outputs" and "MiB" in error["message"]


def test_a_grammar_with_no_finite_match_is_not_reported_as_stop(make_server):
    server = make_server()
    body = {"prompt": "Hi", "max_tokens": 20, "temperature": 0,
            "structured_outputs": {"grammar": 'start: "a" start'}}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200
    assert r.json()["choices"][0]["finish_reason"] == "length"


# -- issue 28: oversized request heads get 431 with a body, not a reset -------------------------

@pytest.fixture(scope="module")
def quiet_server(make_server):
    return make_server()


def _raw_exchange(url: str, head_lines: list[bytes], body: bytes = b"") -> bytes:
    """Sends a whole request on a plain socket, then reads the answer until the server
    closes; raises if the server resets the connection."""
    host, port = url.removeprefix("http://").split(":")
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + b"".join(
        line + b"\r\n" for line in head_lines)
    head += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_300_headers_of_1_kb_get_431_with_a_json_body_on_a_raw_socket(quiet_server):
    from workbench.http.protocol import MAX_HEADER_BYTES

    lines = [b"X-Junk-%d: %s" % (i, b"a" * 1024) for i in range(300)]
    answer = _raw_exchange(quiet_server.url, lines, b'{"prompt": "hi", "max_tokens": 1}')
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"connection: close" in head.lower()
    error = json.loads(body)["error"]
    assert (error["code"], error["type"]) == (431, "RequestHeaderFieldsTooLarge")
    assert f"limit of {MAX_HEADER_BYTES} bytes" in error["message"]


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_oversized_headers_through_httpx_get_431_not_a_reset(quiet_server, method):
    headers = {f"x-junk-{i}": "a" * 1024 for i in range(300)}
    body = {"json": {"prompt": "hi", "max_tokens": 1}} if method == "POST" else {}
    r = httpx.request(method, quiet_server.url + "/v1/completions", headers=headers, timeout=30,
                      **body)
    assert r.status_code == 431
    assert r.json()["error"]["code"] == 431


def test_too_many_small_header_fields_get_431_naming_the_count(quiet_server):
    from workbench.http.protocol import MAX_HEADER_FIELDS

    headers = {f"x-h{i}": "1" for i in range(MAX_HEADER_FIELDS + 1)}
    r = httpx.get(quiet_server.url + "/health", headers=headers, timeout=30)
    assert r.status_code == 431
    message = r.json()["error"]["message"]
    assert "header fields" in message and f"limit is {MAX_HEADER_FIELDS}" in message


def test_a_head_just_within_the_limits_is_served_and_the_server_stays_up(quiet_server):
    from workbench.http.protocol import MAX_HEADER_BYTES, MAX_HEADER_FIELDS

    count = MAX_HEADER_FIELDS - 10  # room for the client's own headers
    value = "a" * (MAX_HEADER_BYTES // count - 40)
    with httpx.Client(base_url=quiet_server.url, timeout=30) as client:
        assert client.get("/health", headers={f"x-h{i}": value for i in range(count)}
                          ).status_code == 200
        assert client.get("/health", headers={f"x-h{i}": "1" for i in range(300)}
                          ).status_code == 431
        assert client.get("/health").status_code == 200  # a new connection, served


def test_workbench_serve_runs_uvicorn_with_the_header_limits(monkeypatch):
    from types import SimpleNamespace

    from workbench.http import server
    from workbench.http.protocol import LimitedH11Protocol
    from workbench.serving.config import ServerConfig

    seen = {}

    class Server:
        signalled = False

        def __init__(self, config, drain, timeout):
            seen["http"] = config.http

        def run(self):
            pass

    state = SimpleNamespace(drain=None, servings=SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(server, "build_app", lambda engine, config: SimpleNamespace(state=state))
    monkeypatch.setattr(server, "DrainingServer", Server)
    assert server.serve_engine(SimpleNamespace(), ServerConfig(), host="127.0.0.1", port=0) == 0
    assert seen["http"] is LimitedH11Protocol


def _wait_for(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
