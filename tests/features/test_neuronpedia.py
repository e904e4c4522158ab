"""Neuronpedia's inference routes (`workbench.serving.neuronpedia`) driven by the unmodified
`neuronpedia-inference-client`, checked against references computed apart from the engine:
transformers' own model's hidden states encoded by SAELens's arithmetic (`saelens_encode`,
transcribed in test_sae.py), and greedy generation on transformers' model with the steering
vector added by a forward hook. Errors in Neuronpedia's shapes; the secret header; streaming."""

from __future__ import annotations

import json
import math

import httpx
import pytest
import torch

from tests.features.test_sae import D_SAE, saelens_encode, weights
from workbench.features.sae import save_sae

pytestmark = pytest.mark.slow

np_client = pytest.importorskip("neuronpedia_inference_client")
from neuronpedia_inference_client import models as m  # noqa: E402
from neuronpedia_inference_client.api.default_api import DefaultApi  # noqa: E402
from neuronpedia_inference_client.exceptions import ApiException  # noqa: E402

KEY = "sekrit"
HOOKS = {"0-res-s": "blocks.0.hook_resid_pre", "1-res-s": "blocks.1.hook_resid_pre",
         "1-other": "blocks.1.hook_resid_pre"}
ARCHITECTURES = {"0-res-s": ("topk", {"k": 12}), "1-res-s": ("standard", {}),
                 "1-other": ("jumprelu", {})}
PROMPT = "The quick brown fox jumps over"


@pytest.fixture(scope="module")
def sae_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("np")
    return {name: save_sae(str(root / name), weights(arch, seed=i), HOOKS[name], arch, **extra)
            for i, (name, (arch, extra)) in enumerate(ARCHITECTURES.items())}


@pytest.fixture(scope="module")
def server(sae_dirs):
    from workbench import LLM, serve_in_kernel
    from workbench.models import tiny_model

    llm = LLM(tiny_model("llama", seed=0, dtype="float32"), max_model_len=128, block_size=16,
              num_kv_blocks=96, seed=0, saes=sae_dirs)
    handle = serve_in_kernel(llm, port=0, api_keys=(KEY,))
    yield handle
    handle.stop(timeout=5)


@pytest.fixture(scope="module")
def api(server):
    config = np_client.Configuration(host=server.base_url, api_key={"SimpleSecretAuth": KEY})
    return DefaultApi(np_client.ApiClient(config))


@pytest.fixture(scope="module")
def reference(sae_dirs):
    """transformers' model (the same seeded weights) and the SAEs' weights and configs."""
    from safetensors.torch import load_file

    from workbench.models import tiny_model

    loaded = tiny_model("llama", seed=0, dtype="float32")
    saes = {name: (load_file(f"{path}/sae_weights.safetensors"),
                   json.loads(open(f"{path}/cfg.json").read())) for name, path in sae_dirs.items()}
    return loaded, saes


MODEL = "tiny-llama"


def hook_rows(reference, ids, hook):
    """The hook's activations on transformers' model: resid_pre of layer L is hidden_states[L]."""
    loaded, _ = reference
    with torch.no_grad():
        out = loaded.model(torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[int(hook.split(".")[1])][0]


def encoded(reference, ids, source):
    w, cfg = reference[1][source]
    return saelens_encode(w, cfg, hook_rows(reference, ids, HOOKS[source]))


def bos_ids(reference, text):
    tokenizer = reference[0].tokenizer
    return [tokenizer.bos_token_id] + tokenizer(text, add_special_tokens=False).input_ids


def test_activation_all_ranks_every_sources_features_as_neuronpedia(api, reference):
    ids = bos_ids(reference, PROMPT)
    r = api.activation_all_post(m.ActivationAllPostRequest(
        prompt=PROMPT, model=MODEL, source_set="res-s", selected_sources=[],
        sort_by_token_indexes=[], ignore_bos=True, num_results=12))
    assert len(r.tokens) == len(ids) and r.tokens[0] == "<|im_start|>"
    acts = {s: encoded(reference, ids, s) for s in ("0-res-s", "1-res-s")}
    for a in acts.values():
        a[0] = 0  # ignore_bos
    rows = sorted(((float(a[:, i].max()), s, i) for s, a in acts.items() for i in range(D_SAE)),
                  key=lambda t: -t[0])[:12]
    assert [(f.source, f.index) for f in r.activations] == [(s, i) for _, s, i in rows]
    for f in r.activations:
        column = acts[f.source][:, f.index]
        scale = acts[f.source].abs().max()
        assert (torch.tensor(f.values) - column).abs().max() <= 1e-6 * scale
        assert f.max_value_index == int(column.argmax()) and f.sum_values == 0
    by_sum = api.activation_all_post(m.ActivationAllPostRequest(
        prompt=PROMPT, model=MODEL, source_set="res-s", selected_sources=["1-res-s"],
        sort_by_token_indexes=[2, 3], ignore_bos=False, num_results=5))
    sums = acts["1-res-s"][[2, 3]].sum(0)
    assert [f.index for f in by_sum.activations] == sums.argsort(descending=True)[:5].tolist()
    assert {f.source for f in by_sum.activations} == {"1-res-s"}
    assert by_sum.activations[0].sum_values == pytest.approx(float(sums.max()), rel=1e-5)


def test_the_batch_routes_answer_each_prompt_as_alone(api):
    texts = ["Hello world", PROMPT]
    batch = api.activation_all_batch_post(m.ActivationAllBatchPostRequest(
        prompts=texts, model=MODEL, source_set="res-s", selected_sources=[],
        sort_by_token_indexes=[], ignore_bos=True, num_results=4))
    for text, got in zip(texts, batch.results):
        alone = api.activation_all_post(m.ActivationAllPostRequest(
            prompt=text, model=MODEL, source_set="res-s", selected_sources=[],
            sort_by_token_indexes=[], ignore_bos=True, num_results=4))
        assert got.to_dict() == alone.to_dict()
    topk = api.activation_topk_by_token_batch_post(m.ActivationTopkByTokenBatchPostRequest(
        prompts=texts, model=MODEL, source="1-res-s", top_k=3, ignore_bos=False))
    single = api.activation_single_batch_post(m.ActivationSingleBatchPostRequest(
        prompts=texts, model=MODEL, source="1-other", index="7"))
    for text, t, s in zip(texts, topk.results, single.results):
        assert t.to_dict() == api.activation_topk_by_token_post(m.ActivationTopkByTokenPostRequest(
            prompt=text, model=MODEL, source="1-res-s", top_k=3, ignore_bos=False)).to_dict()
        assert s.to_dict() == api.activation_single_post(m.ActivationSinglePostRequest(
            prompt=text, model=MODEL, source="1-other", index="7")).to_dict()


def test_topk_by_token_is_each_positions_top_features(api, reference):
    ids = bos_ids(reference, PROMPT)
    acts = encoded(reference, ids, "1-other")
    r = api.activation_topk_by_token_post(m.ActivationTopkByTokenPostRequest(
        prompt=PROMPT, model=MODEL, source="1-other", top_k=4, ignore_bos=True))
    assert [p.token_position for p in r.results] == list(range(1, len(ids)))
    assert r.tokens == [p.token for p in r.results] and not any(p.is_special for p in r.results)
    for p in r.results:
        want = acts[p.token_position].topk(4)
        got = [f.feature_index for f in p.top_features]
        assert set(got) == set(want.indices.tolist())
        values = torch.tensor([f.activation_value for f in p.top_features])
        assert (values - want.values).abs().max() <= 1e-6 * acts.abs().max()
    clamped = api.activation_topk_by_token_post(m.ActivationTopkByTokenPostRequest(
        prompt="Hi", model=MODEL, source="1-other", top_k=10_000, ignore_bos=False))
    assert clamped.results[0].is_special and len(clamped.results[0].top_features) == D_SAE


def test_single_reads_one_feature_or_a_direction(api, reference):
    ids = bos_ids(reference, PROMPT)
    r = api.activation_single_post(m.ActivationSinglePostRequest(
        prompt=PROMPT, model=MODEL, source="0-res-s", index="5"))
    column = encoded(reference, ids, "0-res-s")[1:, 5]  # the BOS position dropped
    assert r.tokens == api.tokenize_post(m.TokenizePostRequest(
        model=MODEL, text=PROMPT, prepend_bos=False)).token_strings
    assert (torch.tensor(r.activation.values) - column).abs().max() <= 1e-6
    assert r.activation.max_value_index == int(column.argmax())
    vector = torch.randn(64, generator=torch.Generator().manual_seed(1))
    by_vector = api.activation_single_post(m.ActivationSinglePostRequest(
        prompt=PROMPT, model=MODEL, vector=vector.tolist(), hook="blocks.1.hook_resid_pre"))
    plain = reference[0].tokenizer(PROMPT).input_ids  # no BOS text for a direction
    want = hook_rows(reference, plain, "blocks.1.hook_resid_pre") @ vector
    assert torch.tensor(by_vector.activation.values) == pytest.approx(want, abs=1e-5)
    assert by_vector.tokens_is_special == [False] * len(plain)


def reference_generation(reference, ids, steps, added=None, positions=None):
    """Greedy tokens on transformers' model, `added` [d] added at layer 1's input at every
    position (or at prompt `positions` and every generated one)."""
    model = reference[0].model
    handle = None
    if added is not None:
        def add(module, args, kwargs):
            x = (args[0] if args else kwargs["hidden_states"]).clone()
            if x.shape[1] == 1 or positions is None:
                x = x + added
            else:
                x[:, positions] += added
            return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})
        handle = model.model.layers[1].register_forward_pre_hook(add, with_kwargs=True)
    try:
        with torch.no_grad():
            done = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False)
    finally:
        if handle is not None:
            handle.remove()
    return done[0, len(ids):].tolist()


def steer(api, **overrides):
    fields = dict(prompt=PROMPT, model=MODEL, steer_method="SIMPLE_ADDITIVE",
                  normalize_steering=False, types=["STEERED", "DEFAULT"],
                  features=[m.NPSteerFeature(model=MODEL, source="1-res-s", index=3,
                                             strength=30)],
                  n_completion_tokens=6, temperature=0, strength_multiplier=1.5,
                  freq_penalty=0, seed=1)
    fields.update(overrides)
    return api.steer_completion_post(m.SteerCompletionRequest(**fields))


def test_steered_and_default_completions_side_by_side(api, reference):
    tokenizer = reference[0].tokenizer
    ids = bos_ids(reference, PROMPT)
    r = steer(api, n_logprobs=2)
    outputs = {o.type.value: o for o in r.outputs}
    row = reference[1]["1-res-s"][0]["W_dec"][3]
    steered = reference_generation(reference, ids, 6, row * 45.0)
    assert outputs["STEERED"].output == tokenizer.decode(steered)
    assert outputs["DEFAULT"].output == tokenizer.decode(reference_generation(reference, ids, 6))
    assert outputs["STEERED"].output != outputs["DEFAULT"].output
    lp = outputs["DEFAULT"].logprobs
    assert [x.token for x in lp] == [tokenizer.decode([t]) for t in reference_generation(
        reference, ids, 6)]
    assert all(len(x.top_logprobs) == 2 and x.top_logprobs[0].logprob >= x.top_logprobs[1].logprob
               and x.top_logprobs[0].logprob == x.logprob for x in lp)  # greedy: the best
    normalized = steer(api, normalize_steering=True, types=["STEERED"])
    unit = reference_generation(reference, ids, 6, row / row.norm() * 45.0)
    assert [o.type.value for o in normalized.outputs] == ["STEERED"]
    assert normalized.outputs[0].output == tokenizer.decode(unit)
    by_vector = steer(api, features=None, types=["STEERED"], vectors=[m.NPSteerVector(
        steering_vector=row.tolist(), strength=30, hook="blocks.1.hook_resid_pre")])
    assert by_vector.outputs[0].output == outputs["STEERED"].output


def test_chat_steering_leaves_the_prompts_special_tokens_alone(api, reference):
    tokenizer = reference[0].tokenizer
    messages = [{"role": "user", "content": "Name a colour"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    plain = [p for p, i in enumerate(ids) if i not in tokenizer.all_special_ids]
    row = reference[1]["1-res-s"][0]["W_dec"][3]
    r = api.steer_completion_chat_post(m.SteerCompletionChatPostRequest(
        prompt=[m.NPSteerChatMessage(**messages[0])], model=MODEL,
        steer_method="SIMPLE_ADDITIVE", normalize_steering=False, types=["STEERED", "DEFAULT"],
        features=[m.NPSteerFeature(model=MODEL, source="1-res-s", index=3, strength=30)],
        n_completion_tokens=5, temperature=0, strength_multiplier=1, freq_penalty=0, seed=0,
        steer_special_tokens=False))
    steered = tokenizer.decode(reference_generation(reference, ids, 5, row * 30.0, plain))
    default = tokenizer.decode(reference_generation(reference, ids, 5))
    assert [(o.type.value, o.chat_template[-1].content, o.raw) for o in r.outputs] == [
        ("STEERED", steered, text + steered), ("DEFAULT", default, text + default)]
    assert r.outputs[0].chat_template[0].content == "Name a colour"
    assert r.input.raw == text and [c.role for c in r.input.chat_template] == ["user"]


def test_streaming_sends_every_output_so_far(server, api):
    body = steer(api).to_dict()
    request = m.SteerCompletionRequest(
        prompt=PROMPT, model=MODEL, steer_method="SIMPLE_ADDITIVE", normalize_steering=False,
        types=["STEERED", "DEFAULT"], features=[m.NPSteerFeature(
            model=MODEL, source="1-res-s", index=3, strength=30)], n_completion_tokens=6,
        temperature=0, strength_multiplier=1.5, freq_penalty=0, seed=1, stream=True)
    frames = []
    with httpx.stream("POST", server.base_url + "/steer/completion", json=request.to_dict(),
                      headers={"X-SECRET-KEY": KEY}, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                frames.append(json.loads(line[6:]))
    assert len(frames) >= 6 and frames[-1] == body
    lengths = [sum(len(o["output"]) for o in f["outputs"]) for f in frames]
    assert lengths == sorted(lengths)


def test_tokenize_and_the_sae_utilities(api, reference):
    tokenizer = reference[0].tokenizer
    t = api.tokenize_post(m.TokenizePostRequest(model=MODEL, text=PROMPT))
    assert t.prepend_bos and t.tokens == bos_ids(reference, PROMPT)
    assert t.token_strings == [tokenizer.decode([i]) for i in t.tokens]
    w = reference[1]["1-res-s"][0]
    v = api.util_sae_vector_post(m.UtilSaeVectorPostRequest(model=MODEL, source="1-res-s",
                                                           index=9))
    assert v.hook_name == "blocks.1.hook_resid_pre" and torch.tensor(v.vector).equal(
        w["W_enc"][:, 9])
    near = api.util_sae_topk_by_decoder_cossim_post(m.UtilSaeTopkByDecoderCossimPostRequest(
        model=MODEL, source="1-res-s", num_results=4,
        feature=m.NPFeature(model=MODEL, source="1-res-s", index=9)))
    cosines = torch.nn.functional.cosine_similarity(w["W_dec"], w["W_dec"][9][None], dim=-1)
    assert [f.feature.index for f in near.topk_decoder_cossim_features] == \
        cosines.argsort(descending=True)[:4].tolist()
    assert near.topk_decoder_cossim_features[0].cosine_similarity == pytest.approx(1, abs=1e-6)


@pytest.mark.parametrize("call, status, words", [
    (lambda api: api.activation_topk_by_token_post(m.ActivationTopkByTokenPostRequest(
        prompt="Hi", model=MODEL, source="9-nope", ignore_bos=False)), 400, "no SAE '9-nope'"),
    (lambda api: api.activation_single_post(m.ActivationSinglePostRequest(
        prompt="Hi", model=MODEL, source="1-res-s", index="96")), 400, "out of range"),
    (lambda api: api.activation_single_post(m.ActivationSinglePostRequest(
        prompt="Hi", model=MODEL)), 400, "exactly one of layer/index or vector"),
    (lambda api: api.activation_all_post(m.ActivationAllPostRequest(
        prompt="Hi", model=MODEL, source_set="nope", selected_sources=[],
        sort_by_token_indexes=[], ignore_bos=False)), 400, "Invalid source set"),
    (lambda api: api.activation_all_post(m.ActivationAllPostRequest(
        prompt="Hi", model=MODEL, source_set="res-s", selected_sources=[],
        sort_by_token_indexes=[7], ignore_bos=False)), 400, "index 7 is out of range"),
    (lambda api: api.tokenize_post(m.TokenizePostRequest(model="gpt2-small", text="Hi")), 404,
     "gpt2-small"),
    (lambda api: steer(api, steer_method="ORTHOGONAL_DECOMP"), 400, "ORTHOGONAL_DECOMP"),
    (lambda api: steer(api, vectors=[m.NPSteerVector(steering_vector=[1.0] * 64, strength=1,
                                                     hook="blocks.1.hook_resid_pre")]), 400,
     "exactly one of features or vectors"),
    (lambda api: steer(api, features=None, vectors=[m.NPSteerVector(
        steering_vector=[1.0] * 3, strength=1, hook="blocks.1.hook_resid_pre")]), 400,
     "vectors[0]: its vector does not fit its hook"),
    (lambda api: steer(api, features=[m.NPSteerFeature(model=MODEL, source="1-res-s", index=3,
                                                       strength=1, steering_vector=[0.0] * 64)]),
     400, "steering_vector differs"),
])
def test_bad_requests_answer_in_neuronpedias_shape(api, call, status, words):
    with pytest.raises(ApiException) as error:
        call(api)
    assert error.value.status == status
    assert words in json.loads(error.value.body)["error"]


def test_bodies_the_schema_rejects_and_the_secret(server):
    url = server.base_url + "/activation/topk-by-token"
    body = {"prompt": "Hi", "model": MODEL, "source": "1-res-s", "ignore_bos": False}
    assert httpx.post(url, json=body).status_code == 401
    assert httpx.post(url, json=body, headers={"X-SECRET-KEY": "wrong"}).status_code == 401
    ok = httpx.post(url, json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200
    bad = httpx.post(url, json={**body, "topk": 3}, headers={"X-SECRET-KEY": KEY})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "topk"]
    missing = httpx.post(url, json={"prompt": "Hi", "model": MODEL},
                         headers={"X-SECRET-KEY": KEY})
    assert missing.status_code == 422
    assert {tuple(e["loc"]) for e in missing.json()["detail"]} == {("body", "source"),
                                                                   ("body", "ignore_bos")}
    nan = httpx.post(server.base_url + "/steer/completion", headers={
        "X-SECRET-KEY": KEY, "Content-Type": "application/json"}, content=json.dumps({
            "prompt": "Hi", "model": MODEL, "steer_method": "SIMPLE_ADDITIVE",
            "normalize_steering": False, "types": ["STEERED"], "n_completion_tokens": 2,
            "temperature": 0, "strength_multiplier": 1, "freq_penalty": 0, "seed": 0,
            "features": [{"model": MODEL, "source": "1-res-s", "index": 3,
                          "strength": math.inf}]}))
    assert nan.status_code == 400 and "strength" in nan.text
