"""The Workbench facade's `score_text` / `score_chat`: `.scores` from either back end equal
the offline `LLM.score_text` / `score_chat`; against a server that is not ours (vLLM's fields
only: `/tokenize`, completions with `prompt_logprobs`) the same logprobs and ranks, with the
top-k entropy. On the tiny llama."""

from __future__ import annotations

import json

import httpx
import pytest

PROMPT = "The capital of France is"
TEXTS = [" Paris, on the Seine.", " Lyon."]
CONVERSATION = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "Paris."}]
TOL = 1e-5


@pytest.fixture(scope="module")
def llm(tiny_llama):
    from workbench import LLM

    return LLM(tiny_llama, max_model_len=128, block_size=16, num_kv_blocks=64, seed=0)


@pytest.fixture(scope="module")
def server(llm):
    from workbench import serve_in_kernel

    with serve_in_kernel(llm, port=0) as handle:
        yield handle


@pytest.fixture(scope="module")
def remote(server):
    from workbench import Workbench

    with Workbench(url=server.base_url) as wb:
        yield wb


def _same(a, b, entropy: bool = True) -> None:
    assert a.tokens == b.tokens and [r.token_id for r in a] == [r.token_id for r in b]
    assert [r.rank for r in a] == [r.rank for r in b]
    assert a.logprobs == pytest.approx(b.logprobs, abs=TOL)
    if entropy:
        assert [r.entropy for r in a] == pytest.approx([r.entropy for r in b], abs=TOL)
        assert a.entropy_kind == b.entropy_kind == "full"


def test_both_back_ends_equal_the_offline_engine(llm, local, remote):
    offline = llm.score_text(PROMPT, TEXTS, logprobs=2)
    for wb in (local, remote):
        result = wb.score_text(PROMPT, TEXTS, logprobs=2)
        assert result.ok, result.error
        assert len(result.scores) == 2
        for got, want in zip(result.scores, offline):
            _same(got, want)
            assert [r.part for r in got] == ["scored"] * len(got)


def test_chat_from_both_back_ends(llm, local, remote):
    offline = llm.score_chat(CONVERSATION)[0]
    for wb in (local, remote):
        result = wb.score_chat(CONVERSATION)
        assert result.ok, result.error
        _same(result.scores[0], offline)
    assert "".join(offline.tokens).startswith("Paris.")


def test_what_cannot_be_scored_is_a_400_naming_it(local, remote):
    for wb in (local, remote):
        result = wb.score_chat(CONVERSATION[:1])
        assert result.status_code == 400 and result.error["error"]["param"] == "messages"
        result = wb.score_text(PROMPT, "")
        assert result.status_code == 400 and result.error["error"]["param"] == "text"


def _not_ours(server):
    """A proxy to our server that answers as a server that is not ours: no /v1/validate, and
    a body with a workbench extra is refused (so the facade must send vLLM's fields only)."""
    upstream = httpx.Client(base_url=server.url, timeout=60)
    sent: list[dict] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/validate":
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content) if request.content else None
        if body is not None:
            sent.append(body)
            assert "token_stats" not in body
        answer = upstream.request(request.method, request.url.path, json=body)
        return httpx.Response(answer.status_code, content=answer.content,
                              headers={"content-type": "application/json"})

    return handle, sent, upstream


def test_a_server_that_is_not_ours_scores_with_vllms_fields(server, llm):
    from workbench import Workbench

    handle, sent, upstream = _not_ours(server)
    wb = Workbench(url="http://vllm.invalid/v1")
    wb._backend.client = httpx.Client(transport=httpx.MockTransport(handle))
    try:
        result = wb.score_text(PROMPT, TEXTS, logprobs=3)
        assert result.ok, result.error
        offline = llm.score_text(PROMPT, TEXTS, logprobs=3)
        for got, want in zip(result.scores, offline):
            _same(got, want, entropy=False)
            assert got.entropy_kind == "top-k" and not got.has_stats
        completions = [b for b in sent if "prompt_logprobs" in b]
        assert len(completions) == 1 and completions[0]["max_tokens"] == 1
        chat = wb.score_chat(CONVERSATION)
        assert chat.ok, chat.error
        _same(chat.scores[0], llm.score_chat(CONVERSATION)[0], entropy=False)
    finally:
        wb.close()
        upstream.close()
