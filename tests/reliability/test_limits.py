"""Server limits: the waiting-queue bound (503 + Retry-After), the request timeout (504, blocks
freed), the prompt count, the API key on every route, error counters, sandboxed templates and
secrets kept out of the logs."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import pytest

SECRET = "sk-very-secret-key-123"


def _wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _free(server) -> bool:
    bm = server.engine.engine.block_manager
    return bm.num_free_blocks == bm.num_blocks and not server.engine.engine.requests


async def test_a_full_waiting_queue_answers_503_with_retry_after(make_server, slow_steps):
    server = make_server(engine={"max_num_seqs": 1}, max_waiting_requests=2)
    slow_steps(server)
    long = {"prompt": "Once", "max_tokens": 60, "ignore_eos": True, "temperature": 0}
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        # the first runs before the next two queue (arriving together, all three could find
        # the running slot still empty and two already waiting: the third would be refused)
        busy = [asyncio.create_task(client.post("/v1/completions", json=long))]
        await asyncio.to_thread(_wait_for, lambda: server.engine.stats().num_running == 1)
        busy += [asyncio.create_task(client.post("/v1/completions", json=long)) for _ in range(2)]
        await asyncio.to_thread(_wait_for, lambda: server.engine.stats().num_waiting == 2)
        refused = await client.post("/v1/completions", json=long)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["type"] == "ServiceUnavailableError" and error["code"] == 503
        assert "--max-waiting-requests=2" in error["message"]
        assert [r.status_code for r in await asyncio.gather(*busy)] == [200, 200, 200]
        ok = await client.post("/v1/completions", json={**long, "max_tokens": 2})
        assert ok.status_code == 200  # room again once the queue drained
        metrics = (await client.get("/metrics")).text
        assert 'workbench:request_errors_total{status="503",type="ServiceUnavailableError"} 1.0' \
            in metrics


async def test_a_request_past_its_timeout_is_aborted_with_504(make_server, slow_steps):
    """100 steps of 0.05 s outlast the 2 s timeout; the 2-token request after them does not
    (2 s of room, as these machines are shared)."""
    server = make_server(request_timeout=2)
    slow_steps(server)
    body = {"prompt": "Once", "max_tokens": 100, "ignore_eos": True, "temperature": 0}
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 504
        assert "--request-timeout=2 s" in r.json()["error"]["message"]
        async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
            text = "".join([chunk async for chunk in s.aiter_text()])
        assert '"type":"TimeoutError"' in text.replace(" ", "") and "[DONE]" in text
        quick = await client.post("/v1/completions", json={**body, "max_tokens": 2})
        assert quick.status_code == 200
    await asyncio.to_thread(_wait_for, lambda: _free(server))


def test_more_prompts_than_allowed_is_400_naming_prompt(make_server):
    server = make_server()
    r = httpx.post(server.url + "/v1/completions", json={"prompt": ["a"] * 1025}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_the_api_key_guards_every_route_but_the_exempt_ones(make_server):
    server = make_server(api_keys=(SECRET, "second-key"))
    auth = {"Authorization": f"Bearer {SECRET}"}
    routes = [("GET", "/v1/models", None), ("POST", "/tokenize", {"prompt": "hi"}),
              ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1}),
              ("GET", "/version", None), ("GET", "/openapi.json", None)]
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for method, path, body in routes:
            r = client.request(method, path, json=body)
            assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}, path
            wrong = client.request(method, path, json=body, headers={"Authorization": "Bearer x"})
            assert wrong.status_code == 401, path
            assert client.request(method, path, json=body, headers=auth).status_code == 200, path
        other = {"Authorization": "Bearer second-key"}
        assert client.get("/v1/models", headers=other).status_code == 200
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200
        assert 'workbench:request_errors_total{status="401",type="Unauthorized"}' in \
            client.get("/metrics").text


def test_no_exemption_guards_health_too(make_server):
    server = make_server(api_keys=(SECRET,), api_key_exempt=())
    assert httpx.get(server.url + "/health").status_code == 401
    assert httpx.get(server.url + "/health",
                     headers={"Authorization": f"Bearer {SECRET}"}).status_code == 200


def test_the_api_key_never_reaches_the_logs(make_server, caplog):
    server = make_server(api_keys=(SECRET,), enable_log_requests=True, log_error_stack=True)
    auth = {"Authorization": f"Bearer {SECRET}"}
    with caplog.at_level(logging.DEBUG):
        with httpx.Client(base_url=server.url, timeout=60, headers=auth) as client:
            assert client.post("/v1/completions",
                               json={"prompt": "hi", "max_tokens": 2}).status_code == 200
            assert client.post("/v1/completions", json={"prompt": "hi", "n": 0}).status_code == 400
            assert client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).status_code == 200
            client.post("/v1/completions", json={"prompt": "hi"},
                        headers={"Authorization": f"Bearer {SECRET}x"})
    assert "Received request" in caplog.text  # the request log is on
    assert SECRET not in caplog.text


ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{% for m in messages %}{{ m.__class__.__base__.__subclasses__() }}{% endfor %}",
    "{{ self._TemplateReference__context }}{{ ''.__class__.__mro__ }}",
    "{{ messages.append(1) }}{{ messages.pop() }}",
]


@pytest.mark.parametrize("template", ESCAPES)
def test_request_templates_render_in_the_sandbox(make_server, template):
    server = getattr(test_request_templates_render_in_the_sandbox, "server", None)
    if server is None:
        server = make_server(trust_request_chat_template=True)
        test_request_templates_render_in_the_sandbox.server = server
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "chat_template": template}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert "<class" not in r.text and "uid=" not in r.text
    assert httpx.get(server.url + "/health").status_code == 200


def test_request_templates_need_the_trust_flag(make_server):
    server = make_server()
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ 'x' }}"}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and "--trust-request-chat-template" in r.json()["error"]["message"]


def test_a_server_template_is_sandboxed_too(make_server):
    server = make_server(chat_template=ESCAPES[0])
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and "<class" not in r.text
