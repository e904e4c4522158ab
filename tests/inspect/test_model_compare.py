"""`LLM.compare` / `Workbench.compare` / `POST /v1/compare`: one text teacher-forced through
the base model, a LoRA adapter and an intervention in one batch; logprobs and exact KL equal a
direct computation with transformers (softmax of its logits: the adapter merged with peft, the
intervention as a forward hook); HTTP equals offline; a server that is not ours gets no KL.
On the tiny llama."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from tests.lora.helpers import fresh_tiny, make_adapter
from workbench import LLM, LoRARequest, Workbench, serve_in_kernel
from workbench.inspect.logprob_diff import LogprobDiff
from workbench.inspect.model_compare import ModelComparison
from workbench.sampling_params import SamplingParams
from workbench.serving.config import ServerConfig

PROMPT = "The capital of France is"
TEXT = " Paris, on the Seine, since long ago."
SCALE = [{"site": "blocks.0.hook_resid_post", "op": "scale", "scale": 1.5}]
LP_TOL, KL_TOL = 2e-4, 2e-5


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return make_adapter(tmp_path_factory.mktemp("cmp") / "b", seed=2, rank=8,
                        base_model="tiny-llama", targets=("q_proj", "v_proj", "o_proj",
                                                          "up_proj", "down_proj"))


@pytest.fixture(scope="module")
def llm():
    return LLM(fresh_tiny(), enable_lora=True, max_loras=2, dtype="float32", num_kv_blocks=64,
               max_model_len=128, block_size=16)


@pytest.fixture(scope="module")
def lora(adapter):
    return LoRARequest("b", 1, str(adapter))


@pytest.fixture(scope="module")
def variants(lora):
    return [None, lora, {"interventions": SCALE, "name": "scaled"}]


@pytest.fixture(scope="module")
def offline(llm, variants):
    return llm.compare(PROMPT, TEXT, variants)


def _reference_logprobs(adapter, ids: list[int], start: int) -> dict[str, torch.Tensor]:
    """transformers' log-softmax at the positions predicting tokens start.. of `ids`: base,
    the adapter merged (peft), the base with layer 0's output scaled by 1.5 (a forward hook)."""
    from peft import PeftModel

    x = torch.tensor([ids])
    out = {}
    base = fresh_tiny().model.eval()
    with torch.no_grad():
        out["tiny-llama"] = base(x).logits[0].log_softmax(-1)
        handle = base.model.layers[0].register_forward_hook(
            lambda _m, _i, o: (o[0] * 1.5, *o[1:]) if isinstance(o, tuple) else o * 1.5)
        out["scaled"] = base(x).logits[0].log_softmax(-1)
        handle.remove()
        merged = PeftModel.from_pretrained(fresh_tiny().model, str(adapter)).merge_and_unload()
        out["b"] = merged.eval()(x).logits[0].log_softmax(-1)
    return {k: v[start - 1:len(ids) - 1].double() for k, v in out.items()}


def _kl(p: torch.Tensor, q: torch.Tensor) -> list[float]:
    return (p.exp() * (p - q)).sum(-1).tolist()


def test_kl_and_logprobs_equal_transformers(llm, adapter, offline):
    tok = llm.get_tokenizer()
    context = tok(PROMPT)["input_ids"]
    text = tok(TEXT, add_special_tokens=False)["input_ids"]
    ids, start = context + text, len(context)
    ref = _reference_logprobs(adapter, ids, start)
    assert offline.names == ["tiny-llama", "b", "scaled"]
    assert list(offline.token_ids) == text and len(offline) == len(text)
    targets = torch.tensor(text)
    worst_lp = worst_kl = 0.0
    for name, lps in ref.items():
        want = lps.gather(1, targets[:, None])[:, 0].tolist()
        got = offline[name].logprobs
        assert got == pytest.approx(want, abs=LP_TOL), name
        worst_lp = max(worst_lp, max(abs(a - b) for a, b in zip(got, want)))
        kl = _kl(ref["tiny-llama"], lps)
        assert offline[name].kl == pytest.approx(kl, abs=KL_TOL), name
        assert offline[name].kl_reverse == pytest.approx(_kl(lps, ref["tiny-llama"]),
                                                         abs=KL_TOL), name
        worst_kl = max(worst_kl, max(abs(a - b) for a, b in zip(offline[name].kl, kl)))
        assert list(offline[name].argmax_ids) == lps.argmax(-1).tolist()
    assert offline["tiny-llama"].kl == pytest.approx([0.0] * len(text), abs=1e-9)
    assert min(offline["b"].kl) > 1e-4 and min(offline["scaled"].kl) > 1e-4  # both differ
    print(f"max |logprob - transformers| {worst_lp:.2e}, max |KL - transformers| {worst_kl:.2e}")


def test_the_summary_and_deltas(offline):
    summary = offline.summary()
    b = offline["b"]
    assert offline.delta("b") == pytest.approx(
        [x - y for x, y in zip(b.logprobs, offline.base.logprobs)])
    assert summary["b"]["delta_total"] == pytest.approx(b.total_logprob
                                                        - offline.base.total_logprob)
    assert summary["b"]["mean_kl"] == pytest.approx(sum(b.kl) / len(b.kl))
    assert summary["tiny-llama"]["argmax_agreement"] == 1.0
    assert 0.0 <= summary["scaled"]["argmax_agreement"] <= 1.0


def test_variants_run_in_one_batch(llm, variants):
    engine = llm.llm_engine
    before = engine.stats().num_steps
    llm.compare(PROMPT, TEXT, variants)
    assert engine.stats().num_steps - before == 1  # three prompts prefilled, scored, finished


def test_views(offline):
    import matplotlib

    matplotlib.use("Agg")
    frame = offline.to_frame()
    assert len(frame) == len(offline)
    assert {"token", "b logprob", "b delta", "b kl", "scaled kl", "scaled argmax"} <= set(
        frame.columns)
    html = offline._repr_html_()
    assert "wb-model-compare-" in html and "KL(reference ‖ variant)" in html
    assert html == ModelComparison.from_body(offline.to_dict())._repr_html_()  # deterministic
    assert "background:#" not in html or "wb-theme" in html  # painted cells have a dark twin
    ax = offline.plot()
    assert len(ax.figure.axes) == 2  # Δ logprob, then KL
    diff = offline.diff("b")
    assert isinstance(diff, LogprobDiff) and diff.diverged_at is None
    assert [r.delta for r in diff] == pytest.approx(offline.delta("b"))
    assert "mean KL" in repr(offline)


def test_what_a_comparison_refuses(llm, lora):
    from workbench.errors import ValidationError

    with pytest.raises(ValidationError, match="at least two"):
        llm.compare(PROMPT, TEXT, [None])
    with pytest.raises(ValidationError, match="must differ"):
        llm.compare(PROMPT, TEXT, [None, {"interventions": SCALE, "name": "tiny-llama"}])
    with pytest.raises(ValidationError, match="reference"):
        llm.compare(PROMPT, TEXT, [None, lora], reference=2)
    with pytest.raises(ValidationError, match="no tokens"):
        llm.compare(PROMPT, "", [None, lora])
    with pytest.raises(ValidationError, match="prompt_distributions_from"):
        SamplingParams(prompt_distributions_from=2)  # needs prompt_logprobs


def _config(adapter) -> dict:
    return {"lora_modules": (f"b={adapter}",)}


@pytest.fixture(scope="module")
def server(llm, adapter):
    with serve_in_kernel(llm, port=0, **_config(adapter)) as handle:
        yield handle


@pytest.fixture(scope="module")
def local(llm, adapter):
    with Workbench(llm, config=ServerConfig(**_config(adapter))) as wb:
        yield wb


@pytest.fixture(scope="module")
def remote(server):
    with Workbench(url=server.base_url) as wb:
        yield wb


HTTP_VARIANTS = [None, "b", {"interventions": SCALE, "name": "scaled"}]


def _same(got: ModelComparison, want: ModelComparison, kl: bool = True) -> None:
    """Equal up to float rounding (a batch of another shape may round differently: the
    torch kernel is not batch-invariant)."""
    assert got.names == want.names and got.tokens == want.tokens
    for name in want.names:
        assert got[name].logprobs == pytest.approx(want[name].logprobs, abs=1e-5)
        assert got.delta(name) == pytest.approx(want.delta(name), abs=1e-5)
        assert got[name].ranks == want[name].ranks
        assert got[name].argmax_tokens == want[name].argmax_tokens
        if kl:
            assert got[name].kl == pytest.approx(want[name].kl, abs=1e-6)


def test_http_equals_offline(local, remote, offline):
    for wb in (local, remote):
        result = wb.compare(PROMPT, TEXT, HTTP_VARIANTS)
        assert result.ok, result.error
        assert result.comparison.kl_available
        _same(result.comparison, offline)


def test_the_route_is_one_batch_and_refuses_what_it_does_not_know(llm, server, monkeypatch):
    outputs = []
    make = llm.llm_engine.outputs.make_output

    def spy(req):  # the route's engine outputs (several fronts may step this engine)
        out = make(req)
        if out is not None and out.request_id.startswith("cmp-"):
            outputs.append(out)
        return out

    monkeypatch.setattr(llm.llm_engine.outputs, "make_output", spy)
    body = {"prompt": PROMPT, "text": TEXT,
            "variants": [{}, {"model": "b"}, {"interventions": SCALE}]}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        answer = http.post("/v1/compare", json=body)
        assert answer.status_code == 200, answer.text
        assert len(outputs) == 3 and all(o.metrics.num_prefill_steps == 1 for o in outputs)
        assert len({o.metrics.first_scheduled_time for o in outputs}) == 1  # the same step
        names = [v["name"] for v in answer.json()["variants"]]
        assert names == ["tiny-llama", "b", "tiny-llama + interventions"]
        assert "distributions" not in answer.text
        bad = http.post("/v1/compare", json={**body, "top_k": 3})
        assert bad.status_code == 400 and "top_k" in bad.text
        missing = http.post("/v1/compare", json={**body, "variants": [{}, {"model": "nope"}]})
        assert missing.status_code == 404
        wrong = http.post("/v1/compare", json={**body, "variants": [
            {}, {"interventions": [{"site": "blocks.9.hook_resid_post", "op": "zero"}]}]})
        assert wrong.status_code == 400 and "variants[1].interventions" in wrong.text


def _not_ours(server):
    """A proxy answering as a server that is not ours: no /v1/validate, no /v1/compare, and
    a body with a workbench extra fails the test."""
    upstream = httpx.Client(base_url=server.url, timeout=60)
    sent: list[dict] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/v1/validate", "/v1/compare"):
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content) if request.content else None
        if body is not None:
            sent.append(body)
            assert "token_stats" not in body and "interventions" not in body
        answer = upstream.request(request.method, request.url.path, json=body)
        return httpx.Response(answer.status_code, content=answer.content,
                              headers={"content-type": "application/json"})

    return handle, sent, upstream


def test_a_server_that_is_not_ours_gets_exact_deltas_and_no_kl(server, offline):
    handle, sent, upstream = _not_ours(server)
    wb = Workbench(url="http://vllm.invalid/v1")
    wb._backend.client = httpx.Client(transport=httpx.MockTransport(handle))
    try:
        result = wb.compare(PROMPT, TEXT, [None, "b"])
        assert result.ok, result.error
        cmp = result.comparison
        assert not cmp.kl_available and "not a workbench server" in cmp.kl_unavailable_reason
        assert all(v.kl is None for v in cmp.variants)
        assert cmp.summary()["b"]["mean_kl"] is None
        assert "b kl" not in cmp.to_frame().columns
        assert "KL unavailable" in cmp._repr_html_() and len(cmp.plot().figure.axes) == 1
        want = ModelComparison.from_body({**offline.to_dict(), "variants": [
            v.to_dict() for v in offline.variants[:2]]})
        _same(cmp, want, kl=False)
        assert [b.get("model") for b in sent if "prompt_logprobs" in b] == ["tiny-llama", "b"]
        refused = wb.compare(PROMPT, TEXT, [None, {"interventions": SCALE}])
        assert refused.status_code == 400
        assert refused.error["error"]["param"] == "variants[1].interventions"
    finally:
        wb.close()
        upstream.close()


CONVERSATION = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "Paris, on the Seine."}]


def test_a_chat_turn_compares_the_turns_tokens_everywhere(llm, lora, local, remote, server):
    offline = llm.compare_chat(CONVERSATION, [None, lora])
    scored = llm.score_chat(CONVERSATION)[0]
    assert list(offline.tokens) == scored.tokens  # the turn and its end, as score_chat's
    assert offline.base.logprobs == pytest.approx(scored.logprobs, abs=1e-5)
    assert offline["b"].kl[0] > 0
    for wb in (local, remote):
        result = wb.compare_chat(CONVERSATION, [None, "b"])
        assert result.ok, result.error
        _same(result.comparison, offline)
    refused = local.compare_chat(CONVERSATION[:1], [None, "b"])
    assert refused.status_code == 400 and refused.error["error"]["param"] == "messages"
    handle, _, upstream = _not_ours(server)
    wb = Workbench(url="http://vllm.invalid/v1")
    wb._backend.client = httpx.Client(transport=httpx.MockTransport(handle))
    try:
        result = wb.compare_chat(CONVERSATION, [None, "b"])
        assert result.ok, result.error
        assert not result.comparison.kl_available
        _same(result.comparison, offline, kl=False)
    finally:
        wb.close()
        upstream.close()
