"""A fault inside the engine step for one request, over HTTP: that request gets a 500 naming
it (or an in-stream error event), the requests sent with it are answered normally, and the
server keeps serving."""

from __future__ import annotations

import asyncio
import logging

import httpx

from tests.engine.helpers import BAD_SEED, faulty_sampler


async def test_a_sampler_fault_is_a_500_for_its_request_only(make_server, monkeypatch):
    server = make_server()
    engine = server.engine.engine
    real = engine.generation_handler.sampler

    good = [{"prompt": f"Count {i}:", "max_tokens": 6, "temperature": 0} for i in range(6)]
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        expected = [(await client.post("/v1/completions", json=b)).json()["choices"][0]["text"]
                    for b in good]
        monkeypatch.setattr(engine.generation_handler, "sampler", faulty_sampler(real))
        bad = {"prompt": "Count 9:", "max_tokens": 6, "seed": BAD_SEED}
        answers = await asyncio.gather(
            client.post("/v1/completions", json=bad, headers={"X-Request-Id": "the-bad-one"}),
            client.post("/v1/completions", json={**bad, "stream": True}),
            *(client.post("/v1/completions", json=b) for b in good))
        failed, streamed, *served = answers
        assert failed.status_code == 500
        error = failed.json()["error"]
        assert error["type"] == "InternalServerError"
        assert error["message"] == "Internal server error"  # vLLM's; the log names the id
        assert streamed.status_code == 200 and '"InternalServerError"' in streamed.text
        assert [r.json()["choices"][0]["text"] for r in served] == expected
        assert (await client.get("/health")).status_code == 200
        metrics = (await client.get("/metrics")).text
        assert 'workbench:request_errors_total{status="500",type="InternalServerError"} 1.0' \
            in metrics
        assert 'workbench:request_errors_total{status="200",type="InternalServerError"} 1.0' \
            in metrics
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def _model_fails_for(engine, monkeypatch, seed: int) -> None:
    """The model's forward raises in every step that holds a request with this seed."""
    real = engine.runner.execute

    def execute(out):
        if any(s.seq.request.params.seed == seed for s in out.scheduled):
            raise RuntimeError("simulated kernel failure")
        return real(out)

    monkeypatch.setattr(engine.runner, "execute", execute)


async def test_a_model_failure_is_a_500_and_the_log_names_the_request_and_cause(
        make_server, monkeypatch, caplog):
    server = make_server()
    engine = server.engine.engine
    _model_fails_for(engine, monkeypatch, BAD_SEED)
    bad = {"prompt": "Count 9:", "max_tokens": 6, "seed": BAD_SEED}
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        with caplog.at_level(logging.ERROR, logger="workbench"):
            failed = await client.post("/v1/completions", json=bad,
                                       headers={"X-Request-Id": "the-bad-one"})
            streamed = await client.post("/v1/completions", json={**bad, "stream": True},
                                         headers={"X-Request-Id": "the-bad-stream"})
        assert failed.status_code == 500
        assert failed.json() == {"error": {"message": "Internal server error",
                                           "type": "InternalServerError", "param": None,
                                           "code": 500}}
        assert streamed.status_code == 200
        events = [line for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert '"InternalServerError"' in events[-2] and events[-1] == "data: [DONE]"
        ok = await client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert ok.status_code == 200
    engine_lines = [r.getMessage() for r in caplog.records if r.name == "workbench.engine"]
    for rid in ("the-bad-one", "the-bad-stream"):
        assert any(rid in line and "RuntimeError: simulated kernel failure" in line
                   for line in engine_lines), engine_lines
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
