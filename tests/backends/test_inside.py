"""The Workbench facade with `capture` / `logit_lens` / `interventions`: `.activations` and
`.logit_lens` from either back end, equal to the offline engine's; a remote server that is not
ours refuses them client-side. On the tiny llama."""

from __future__ import annotations

import httpx
import pytest

from workbench.sampling_params import SamplingParams

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "hi"}]
CAPTURE = {"sites": ["resid_post"], "layers": [0]}


@pytest.fixture(scope="module")
def llm(tiny_llama):
    from workbench import LLM

    return LLM(tiny_llama, max_model_len=128, block_size=16, num_kv_blocks=64, seed=0)


def test_activations_from_both_back_ends_equal_the_offline_engine(llm, local, remote):
    from workbench.inspect.activations import ActivationCache

    offline = llm.generate(PROMPT, SamplingParams(max_tokens=3, temperature=0,
                                                  capture=CAPTURE))[0].activations
    for wb in (local, remote):
        result = wb.completions(PROMPT, max_tokens=3, temperature=0, capture=CAPTURE)
        assert result.ok, result.error
        assert isinstance(result.activations, ActivationCache)
        assert result.activations.to_wire() == offline.to_wire()
        assert result.logit_lens is None


def test_chat_logit_lens_from_both_back_ends(local, remote):
    from workbench.inspect.logit_lens import LogitLens

    wires = []
    for wb in (local, remote):
        result = wb.chat(MESSAGES, max_tokens=2, temperature=0, logit_lens={"top_k": 2})
        assert result.ok, result.error
        assert isinstance(result.logit_lens, LogitLens) and result.activations is None
        wires.append(result.response["choices"][0]["logit_lens"])
    assert wires[0] == wires[1]


def test_the_report_lists_the_capture(local):
    result = local.completions(PROMPT, max_tokens=2, capture=CAPTURE)
    row = result.report["capture"]
    assert row.status == "passed" and row.value["sites"] == ["blocks.0.hook_resid_post"]


def test_a_bad_capture_is_the_servers_error(local, remote):
    for wb in (local, remote):
        result = wb.completions(PROMPT, max_tokens=2, capture={"sites": ["nope"]})
        assert result.status_code == 400 and result.error["error"]["param"] == "capture.sites"


def test_results_without_them_have_none(local):
    result = local.completions(PROMPT, max_tokens=2)
    assert result.activations is None and result.logit_lens is None


def _vllm_like(request: httpx.Request) -> httpx.Response:
    """A server that is not ours: no /v1/validate, unknown body fields dropped."""
    path = request.url.path
    if path == "/v1/models":
        return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})
    if path == "/v1/completions":
        return httpx.Response(200, json={"id": "x", "object": "text_completion", "model": "m",
                                         "choices": [{"index": 0, "text": " Paris",
                                                      "finish_reason": "length"}]})
    return httpx.Response(404, json={"detail": "Not Found"})


@pytest.fixture
def not_ours():
    from workbench import Workbench

    wb = Workbench(url="http://vllm.invalid/v1")
    wb._backend.client = httpx.Client(transport=httpx.MockTransport(_vllm_like))
    yield wb
    wb.close()


@pytest.mark.parametrize("field, value", [
    ("capture", CAPTURE), ("logit_lens", {"top_k": 2}),
    ("interventions", [{"site": "resid_post", "layer": 0, "op": "zero"}]),
    ("token_stats", True),
])
def test_a_server_that_is_not_ours_refuses_them_client_side(not_ours, field, value):
    result = not_ours.completions(PROMPT, max_tokens=2, **{field: value})
    assert not result.ok and result.status_code == 400
    error = result.error["error"]
    assert error["param"] == field and "workbench serve" in error["message"]
    assert result.report is not None and not result.report.ok
    assert result.report[field].status == "failed" and result.report[field].stage == "client"
    chunks = list(not_ours.stream_completions(PROMPT, **{field: value}))
    assert chunks == [result.error]


def test_a_server_that_is_not_ours_still_serves_plain_requests(not_ours):
    result = not_ours.completions(PROMPT, max_tokens=2)
    assert result.ok and result.text == " Paris" and result.activations is None


def test_our_server_is_recognised(remote):
    assert remote._backend.ours
