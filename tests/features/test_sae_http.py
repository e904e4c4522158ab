"""SAE features over HTTP with the official `openai` client: `/v1/models` lists the SAEs on the
base model's card; completions and chat completions take `features` (extra_body) and answer each
choice's `features` (its wire form, streamed on the piece that finishes the choice) equal to the
engine's own; steering by feature; a bad field a 400 naming it; `--sae` at the command line."""

from __future__ import annotations

import pytest
import torch

from tests.features.test_sae import D_SAE, HOOK, weights
from workbench.features.sae import save_sae
from workbench.inside.recorded import FeatureData

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory):
    return save_sae(str(tmp_path_factory.mktemp("sae") / "s"), weights("standard", seed=4), HOOK)


@pytest.fixture(scope="module")
def llm(sae_dir):
    from workbench import LLM
    from workbench.models import tiny_model

    return LLM(tiny_model("llama", seed=0, dtype="float32"), max_model_len=128, block_size=16,
               num_kv_blocks=64, seed=0, saes={"res-s": sae_dir})


@pytest.fixture(scope="module")
def client(llm):
    import openai

    from workbench import serve_in_kernel

    handle = serve_in_kernel(llm, port=0)
    yield openai.OpenAI(base_url=handle.base_url, api_key="unused", max_retries=0, timeout=60)
    handle.stop(timeout=5)


def test_models_list_the_saes(client):
    card = client.models.list().data[0]
    assert card.saes == [{"name": "res-s", "hook_name": HOOK, "architecture": "standard",
                          "d_in": 64, "d_sae": D_SAE}]


def test_a_completion_answers_its_features_as_the_engine_reads_them(client, llm):
    ask = {"sae": "res-s", "top_k": 3, "indices": [2, 7]}
    r = client.completions.create(model=client.models.list().data[0].id, prompt="Hello world",
                                  max_tokens=4, temperature=0, extra_body={"features": ask})
    got = FeatureData.from_wire(r.choices[0].model_extra["features"])
    from workbench import SamplingParams

    local = llm.generate(["Hello world"], SamplingParams(max_tokens=4, temperature=0,
                                                          features=ask))[0].features
    assert got.positions == local.positions and got.top_ids.tolist() == local.top_ids.tolist()
    assert got.top_values.equal(local.top_values) and got.values.equal(local.values)
    assert got.l0 == local.l0 and got.sae == "res-s" and got.hook_name == HOOK


def test_a_streamed_chat_carries_features_on_its_last_piece(client):
    model = client.models.list().data[0].id
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0,
        stream=True, extra_body={"features": "res-s"}))
    carrying = [c for c in chunks if c.choices and (c.choices[0].model_extra or {}).get(
        "features")]
    assert len(carrying) == 1 and carrying[0].choices[0].finish_reason is not None
    data = FeatureData.from_wire(carrying[0].choices[0].model_extra["features"])
    assert data.top_ids.shape[1] == 10 and len(data.l0) == len(data.positions)


def test_steering_by_feature_over_http(client):
    model = client.models.list().data[0].id
    plain = client.completions.create(model=model, prompt="Once", max_tokens=6, temperature=0,
                                      logprobs=1)
    steered = client.completions.create(
        model=model, prompt="Once", max_tokens=6, temperature=0, logprobs=1,
        extra_body={"interventions": [{"feature": {"sae": "res-s", "index": 3}, "scale": 50}]})
    assert steered.choices[0].logprobs.token_logprobs != plain.choices[0].logprobs.token_logprobs


@pytest.mark.parametrize("body, param", [
    ({"features": {"sae": "nope"}}, "features.sae"),
    ({"features": {"sae": "res-s", "indices": [D_SAE]}}, "features.indices"),
    ({"features": {"sae": "res-s", "top_k": 0}}, "features.top_k"),
    ({"interventions": [{"feature": {"sae": "res-s", "index": 1}, "scale": "x"}]},
     "interventions[0].scale"),
])
def test_bad_feature_fields_are_400s_naming_the_field(client, body, param):
    import openai

    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model=client.models.list().data[0].id, prompt="Hi",
                                  max_tokens=2, extra_body=body)
    assert error.value.body["param"] == param


def test_the_command_line_takes_sae_flags(sae_dir, tmp_path):
    from workbench.apps.cli import build_parser
    from workbench.apps.cli import configs_from_args as configs

    args = build_parser().parse_args(["serve", "smollm2-135m-instruct", "--sae", f"a={sae_dir}",
                                      "--sae", f"b={sae_dir}"])
    engine, _ = configs(args)
    assert engine.saes == (("a", sae_dir), ("b", sae_dir))
    with pytest.raises(ValueError, match="no such folder"):
        configs(build_parser().parse_args(["serve", "smollm2-135m-instruct", "--sae", f"a={tmp_path / 'x'}"]))
    with pytest.raises(ValueError, match="given twice"):
        configs(build_parser().parse_args(["serve", "smollm2-135m-instruct", "--sae", f"a={sae_dir}", "--sae",
                                           f"a={sae_dir}"]))


def test_saes_load_and_unload_at_run_time_behind_the_runtime_opt_in(llm, tmp_path):
    import httpx

    from workbench import serve_in_kernel

    inside = save_sae(str(tmp_path / "ok" / "late"), weights("standard", seed=6),
                      "blocks.0.hook_resid_post")
    outside = save_sae(str(tmp_path / "elsewhere"), weights("standard", seed=6), HOOK)
    wide = save_sae(str(tmp_path / "ok" / "wide"), weights("standard", d_in=32), HOOK)
    handle = serve_in_kernel(llm, port=0, allow_runtime_lora_updating=True,
                             lora_load_dirs=(str(tmp_path / "ok"),))
    try:
        with httpx.Client(base_url=handle.url, timeout=60) as http:
            r = http.post("/v1/load_sae", json={"sae_name": "late", "sae_path": inside})
            assert r.status_code == 200 and "late" in r.text
            names = [s["name"] for s in http.get("/v1/models").json()["data"][0]["saes"]]
            assert names == ["res-s", "late"]
            r = http.post("/v1/load_sae", json={"sae_name": "x", "sae_path": outside})
            assert r.status_code == 400 and r.json()["error"]["param"] == "sae_path"
            r = http.post("/v1/load_sae", json={"sae_name": "w", "sae_path": wide})
            assert r.status_code == 400 and "d_in 32" in r.json()["error"]["message"]
            r = http.post("/v1/unload_sae", json={"sae_name": "late"})
            assert r.status_code == 200
            r = http.post("/v1/unload_sae", json={"sae_name": "late"})
            assert r.status_code == 400 and "no SAE 'late'" in r.json()["error"]["message"]
    finally:
        handle.stop(timeout=5)
    assert sorted(llm.saes) == ["res-s"]


def test_without_the_opt_in_there_are_no_sae_routes(client):
    import httpx

    with httpx.Client(base_url=str(client.base_url).removesuffix("/v1/").removesuffix("/v1"),
                      timeout=30) as http:
        assert http.post("/v1/load_sae", json={"sae_name": "a", "sae_path": "/"}).status_code \
            == 404


def test_sparse_sae_features_over_http_are_the_engines_bits(client, llm):
    """`capture.sparse`: an SAE's features as a sparse COO tensor, over the wire too (its
    indices and values in the exact wire form), equal to the dense capture."""
    from workbench import SamplingParams
    from workbench.inspect import ActivationCache

    site = f"{HOOK}.hook_sae_acts_post"
    r = client.completions.create(
        model=client.models.list().data[0].id, prompt="Hello world", max_tokens=3,
        temperature=0, extra_body={"capture": {"sites": [site], "sparse": True}})
    got = ActivationCache.from_wire(r.choices[0].model_extra["activations"])[site]
    dense = llm.generate(["Hello world"], SamplingParams(max_tokens=3, temperature=0, capture={
        "sites": [site]}))[0].activations[site]
    assert got.is_sparse and got.shape == dense.shape
    assert torch.equal(got.to_dense(), dense)
