"""schemathesis against our own `/openapi.json`: every route, generated bodies, parameters and
headers; zero 5xx, zero hangs, nothing left in the engine, the server healthy afterwards.

The fuzz server is the tiny llama with a 32-token context, so generated `max_tokens`,
prompts and `n` are mostly refused by the ordinary checks and what runs is cheap.
"""

from __future__ import annotations

import httpx
import pytest

from workbench.apps.soak import engine_leaks, fuzz

EXAMPLES_PER_ROUTE = 120


@pytest.mark.slow
def test_generated_requests_never_get_a_5xx(tiny_llama):
    from workbench import LLM, serve_in_kernel

    llm = LLM(tiny_llama, max_model_len=32, block_size=16, num_kv_blocks=64, max_num_seqs=4,
              seed=0)
    server = serve_in_kernel(llm, port=0, request_timeout=60.0)
    try:
        report = fuzz(server.url, max_examples=EXAMPLES_PER_ROUTE, timeout=90)
        print(report)  # the figures (pytest -s)
        assert report.failures == []
        assert report.status_5xx == 0 and report.hangs == 0
        assert report.fuzz_requests >= 1200  # about 1,600 over the routes of this writing
        assert report.status_2xx > 0 and report.status_4xx > 0  # both kinds were generated
        assert engine_leaks(server.engine) == (0, 0)
        assert httpx.get(server.url + "/health").status_code == 200
        ok = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200
    finally:
        server.stop(timeout=5)
