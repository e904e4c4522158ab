"""Sparse autoencoders in SAELens's format (`workbench.features.sae`): loading and its refusals,
`encode` / `decode` equal to SAELens 6's inference arithmetic (transcribed below from its
`sae_lens/saes/*.py`, in plain torch, independently of ours), features read per request in the
engine (equal to `encode` of the hook's activations, every other request of the batch untouched)
and steering by a feature (the same bits as adding its decoder row as a vector)."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

from tests.engine.helpers import greedy, ids_of, make_llm
from workbench.errors import ValidationError
from workbench.features.sae import SparseAutoencoder, save_sae
from workbench.sampling_params import SamplingParams

D_IN, D_SAE = 64, 96  # the tiny llama's hidden size; features
HOOK = "blocks.1.hook_resid_pre"


def weights(architecture: str, seed: int = 0, d_in: int = D_IN) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {"W_enc": torch.randn(d_in, D_SAE, generator=gen) / math.sqrt(d_in),
           "W_dec": torch.randn(D_SAE, d_in, generator=gen) / math.sqrt(D_SAE),
           "b_dec": torch.randn(d_in, generator=gen) * 0.1}
    if architecture == "gated":
        out.update(b_gate=torch.randn(D_SAE, generator=gen) * 0.1,
                   b_mag=torch.randn(D_SAE, generator=gen) * 0.1,
                   r_mag=torch.randn(D_SAE, generator=gen) * 0.1)
    else:
        out["b_enc"] = torch.randn(D_SAE, generator=gen) * 0.1
    if architecture == "jumprelu":
        out["threshold"] = torch.rand(D_SAE, generator=gen) * 0.3
    return out


def saelens_encode(w, cfg, x):
    """SAELens 6's `encode` (process_sae_in, then the architecture's activation)."""
    x = x.float()
    norm = cfg.get("normalize_activations", "none")
    if norm == "constant_norm_rescale":
        x = x * ((cfg["d_in"] ** 0.5) / x.norm(dim=-1, keepdim=True))
    elif norm == "layer_norm":
        mu = x.mean(dim=-1, keepdim=True)
        x = x - mu
        x = x / (x.std(dim=-1, keepdim=True) + 1e-5)
    sae_in = x - w["b_dec"] * cfg.get("apply_b_dec_to_input", True)
    arch = cfg["architecture"]
    if arch == "gated":
        active = (sae_in @ w["W_enc"] + w["b_gate"] > 0).float()
        return active * torch.relu(sae_in @ (w["W_enc"] * w["r_mag"].exp()) + w["b_mag"])
    hidden_pre = sae_in @ w["W_enc"] + w["b_enc"]
    if arch == "jumprelu":
        return torch.relu(hidden_pre) * (hidden_pre > w["threshold"]).float()
    if arch == "topk":
        if cfg.get("rescale_acts_by_decoder_norm"):
            hidden_pre = hidden_pre * w["W_dec"].norm(dim=-1)
        values, indices = torch.topk(hidden_pre, k=cfg["k"], dim=-1, sorted=False)
        return torch.zeros_like(hidden_pre).scatter(-1, indices, values.relu())
    return torch.relu(hidden_pre)


CASES = [("standard", {}), ("jumprelu", {}), ("topk", {"k": 7}),
         ("topk", {"k": 7, "rescale_acts_by_decoder_norm": True}), ("gated", {}),
         ("standard", {"normalize_activations": "constant_norm_rescale"}),
         ("standard", {"normalize_activations": "layer_norm", "apply_b_dec_to_input": False}),
         ("standard", {"normalize_activations": "expected_average_only_in"})]


@pytest.mark.parametrize("architecture, extra", CASES)
def test_encode_and_decode_are_saelens_arithmetic(tmp_path, architecture, extra):
    w = weights(architecture)
    path = save_sae(str(tmp_path / "sae"), w, HOOK, architecture, **extra)
    sae = SparseAutoencoder.load("s", path)
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    x = torch.randn(9, D_IN, generator=torch.Generator().manual_seed(1)) * 3
    acts = sae.encode(x)
    expected = saelens_encode(w, cfg, x)
    scale = expected.abs().max()
    assert (acts - expected).abs().max() <= 1e-6 * scale
    assert torch.equal(acts > 0, expected > 0)
    recons = sae.decode(acts, x)
    if extra.get("rescale_acts_by_decoder_norm"):  # SAELens's act_times_W_dec
        expected = expected * (1 / w["W_dec"].norm(dim=-1))
    reference = expected @ w["W_dec"] + w["b_dec"]
    if extra.get("normalize_activations") == "layer_norm":
        mu = x.mean(-1, keepdim=True)
        reference = reference * (x - mu).std(-1, keepdim=True) + mu
    elif extra.get("normalize_activations") == "constant_norm_rescale":
        reference = reference / ((D_IN ** 0.5) / x.norm(dim=-1, keepdim=True))
    torch.testing.assert_close(recons, reference, rtol=1e-5, atol=1e-5)
    if architecture == "topk":
        assert ((acts > 0).sum(-1) <= extra["k"]).all()


@pytest.mark.parametrize("architecture, extra", CASES)
def test_a_clamped_feature_is_the_spliced_sae_with_its_error_term(tmp_path, architecture, extra):
    """`with_feature` (x plus the edit's share of the decoder) against SAELens's splice:
    decode(edited features) + (x - decode(features))."""
    sae = SparseAutoencoder.load("s", save_sae(str(tmp_path / "sae"), weights(architecture),
                                               HOOK, architecture, **extra))
    x = torch.randn(5, D_IN, generator=torch.Generator().manual_seed(2)) * 3
    acts = sae.encode(x)
    feature = int(acts.sum(0).argmax())
    edited = acts.clone()
    edited[:, feature] = 6.0
    spliced = sae.decode(edited, x) + (x - sae.decode(acts, x))
    torch.testing.assert_close(sae.with_feature(x, feature, 6.0), spliced, rtol=1e-5, atol=1e-5)


def test_load_refuses_what_it_cannot_compute(tmp_path):
    w = weights("standard")
    with pytest.raises(ValidationError, match="sae_weights.safetensors"):
        SparseAutoencoder.load("s", str(tmp_path / "nothing"))
    path = save_sae(str(tmp_path / "t"), w, HOOK, "crosscoder")
    with pytest.raises(ValidationError, match="'crosscoder' is not an architecture"):
        SparseAutoencoder.load("s", path)
    path = save_sae(str(tmp_path / "z"), w, "blocks.1.attn.hook_z")
    with pytest.raises(ValidationError, match="hook_z|SAEs are served on"):
        SparseAutoencoder.load("s", path)
    bad = dict(w, b_enc=torch.zeros(5))
    path = save_sae(str(tmp_path / "shape"), bad, HOOK)
    with pytest.raises(ValidationError, match=r"b_enc must be \[96\], got \[5\]"):
        SparseAutoencoder.load("s", path)
    path = save_sae(str(tmp_path / "norm"), w, HOOK, normalize_activations="covariance_whitening")
    with pytest.raises(ValidationError, match="covariance_whitening"):
        SparseAutoencoder.load("s", path)


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory):
    return save_sae(str(tmp_path_factory.mktemp("sae") / "s"), weights("jumprelu", seed=3), HOOK,
                    "jumprelu")


@pytest.fixture(scope="module")
def llm(sae_dir):
    from workbench.models import tiny_model

    return make_llm(tiny_model("llama", seed=0, dtype="float32"), saes={"s": sae_dir})


def test_an_sae_made_for_another_model_is_refused_at_load(tmp_path, llm):
    wide = save_sae(str(tmp_path / "wide"), weights("standard", d_in=32), HOOK)
    with pytest.raises(ValidationError, match="d_in 32 is not the width"):
        llm.load_sae("wide", wide)
    deep = save_sae(str(tmp_path / "deep"), weights("standard"), "blocks.7.hook_resid_post")
    with pytest.raises(ValidationError, match="past the model's 2 layers"):
        llm.load_sae("deep", deep)
    assert sorted(llm.saes) == ["s"]  # nothing loaded half


def test_features_per_request_are_encode_of_the_hooks_activations(llm):
    prompt = ids_of(llm.llm_engine.loaded, "The quick brown fox jumps")
    out = llm.generate([{"prompt_token_ids": prompt}], greedy(
        5, features={"sae": "s", "top_k": 4, "indices": [0, 5, 95]},
        capture={"sites": [HOOK]}))[0]
    data, cached = out.features, out.activations
    x = cached[HOOK]  # [positions, 64]: the same rows the SAE read
    assert data.positions == cached.positions == list(range(len(prompt) + 4))
    sae = llm.saes["s"]
    acts = sae.encode(x)
    scale = acts.abs().max()
    top = acts.topk(4, dim=-1)
    assert (data.top_values - top.values).abs().max() <= 1e-6 * scale
    assert data.top_ids.tolist() == top.indices.tolist()
    assert (data.values - acts[:, [0, 5, 95]]).abs().max() <= 1e-6 * scale
    assert data.l0 == (acts > 0).sum(-1).tolist()
    errors = (x - sae.decode(acts, x)).norm(dim=-1)
    assert data.error_norm == pytest.approx(errors.tolist(), rel=1e-5)
    assert "position" in next(iter(data.missing))  # the last sampled token: never run
    assert data.hook_name == HOOK and data.d_sae == D_SAE


@pytest.mark.parametrize("top_k", [5, 12])  # within the SAE's k (its pairs) and beyond (dense)
def test_a_topk_saes_features_per_request_are_encode_of_the_hooks_activations(llm, tmp_path,
                                                                             top_k):
    llm.load_sae("t", save_sae(str(tmp_path / "t"), weights("topk", seed=6), HOOK, "topk",
                               k=7, rescale_acts_by_decoder_norm=True))
    try:
        prompt = ids_of(llm.llm_engine.loaded, "Pack my box with five dozen")
        out = llm.generate([{"prompt_token_ids": prompt}], greedy(
            3, features={"sae": "t", "top_k": top_k, "indices": [0, 3, 50]},
            capture={"sites": [HOOK]}))[0]
        data, x = out.features, out.activations[HOOK]
        acts = llm.saes["t"].encode(x)
        active = (acts > 0).sum(-1)
        assert data.l0 == active.tolist() and (active <= 7).all()
        assert (data.values - acts[:, [0, 3, 50]]).abs().max() <= 1e-6 * acts.abs().max()
        top = acts.topk(top_k, dim=-1)
        for p in range(len(data.positions)):  # the active ones, most active first
            n = int(active[p])
            assert data.top_ids[p, :n].tolist() == top.indices[p, :n].tolist()
            assert torch.equal(data.top_values[p, :n], top.values[p, :n])
        errors = (x - llm.saes["t"].decode(acts, x)).norm(dim=-1)
        assert data.error_norm == pytest.approx(errors.tolist(), rel=1e-5)
    finally:
        llm.unload_sae("t")


def test_reading_features_leaves_every_other_request_as_it_was(llm):
    prompts = [ids_of(llm.llm_engine.loaded, t) for t in ("Hello there", "One two three four")]
    alone = llm.generate([{"prompt_token_ids": prompts[1]}], greedy(6, logprobs=2))[0]
    both = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        [greedy(6, features="s"), greedy(6, logprobs=2)])
    assert both[1].outputs[0].token_ids == alone.outputs[0].token_ids
    assert [lp for lp in both[1].outputs[0].logprobs] == list(alone.outputs[0].logprobs)
    assert both[1].features is None and both[0].features.top_ids.shape[1] == 10


def test_steering_by_a_feature_adds_its_decoder_row(llm):
    prompt = ids_of(llm.llm_engine.loaded, "Once upon a time")
    row = llm.saes["s"].weights["W_dec"][17]
    by_feature = llm.generate([{"prompt_token_ids": prompt}], greedy(8, logprobs=1, interventions=[
        {"feature": {"sae": "s", "index": 17}, "scale": 40.0}]))[0].outputs[0]
    by_vector = llm.generate([{"prompt_token_ids": prompt}], greedy(8, logprobs=1, interventions=[
        {"site": "resid_pre", "layer": 1, "op": "add", "vector": row.tolist(),
         "scale": 40.0}]))[0].outputs[0]
    plain = llm.generate([{"prompt_token_ids": prompt}], greedy(8, logprobs=1))[0].outputs[0]
    assert by_feature.token_ids == by_vector.token_ids
    assert list(by_feature.logprobs) == list(by_vector.logprobs)
    assert list(by_feature.logprobs) != list(plain.logprobs)


@pytest.mark.parametrize("params, field", [
    ({"features": {"sae": "nope"}}, "features.sae"),
    ({"features": {"sae": "s", "top_k": D_SAE + 1}}, "features.top_k"),
    ({"features": {"sae": "s", "indices": [D_SAE]}}, "features.indices"),
    ({"features": {"sae": "s", "top_k": -1}}, "features.top_k"),
    ({"features": {"sae": "s", "colour": 1}}, "features"),
    ({"interventions": [{"feature": {"sae": "s", "index": D_SAE}}]},
     "interventions[0].feature.index"),
    ({"interventions": [{"feature": {"sae": "t", "index": 1}}]}, "interventions[0].feature.sae"),
    ({"interventions": [{"feature": {"sae": "s", "index": 1}, "scale": float("nan")}]},
     "interventions[0].scale"),
    ({"interventions": [{"feature": {"sae": "s", "index": 1}, "op": "set"}]},
     "interventions[0].value"),
])
def test_bad_feature_fields_are_refused_by_name(llm, params, field):
    with pytest.raises(ValidationError) as error:
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=2, **params))
    assert error.value.parameter == field


def test_a_loaded_sae_can_be_unloaded_and_params_copy(llm, tmp_path):
    path = save_sae(str(tmp_path / "x"), weights("standard", seed=9), "blocks.0.hook_mlp_out")
    llm.load_sae("x", path)
    with pytest.raises(ValidationError, match="already loaded"):
        llm.load_sae("x", path)
    params = greedy(2, features={"sae": "x", "top_k": 3})
    out = llm.generate([{"prompt_token_ids": [1, 2, 3]}], copy.deepcopy(params))[0]
    assert out.features.hook_name == "blocks.0.hook_mlp_out"
    llm.unload_sae("x")
    with pytest.raises(ValidationError, match="no SAE 'x'"):
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], greedy(2, features="x"))


def test_the_llm_hands_features_as_a_view_with_a_frame_and_html(llm):
    from workbench.inspect import FeatureActivations

    prompt = ids_of(llm.llm_engine.loaded, "Red green blue")
    view = llm.generate([{"prompt_token_ids": prompt}], greedy(
        3, features={"sae": "s", "top_k": 3, "indices": [4]}))[0].features
    assert isinstance(view, FeatureActivations)
    frame = view.to_frame()
    assert list(frame.columns) == ["position", "token", "k", "feature", "activation", "l0",
                                   "error_norm", "f_4"]
    assert len(frame) == 3 * len(view.positions)
    assert view.activation(4).equal(view.values[:, 0])
    strongest = view.strongest()
    assert strongest is not None and view.top(0)[0][0] == int(view.top_ids[0, 0])
    page = view._repr_html_()
    assert f"feature {strongest}" in page and "top features" in page and "background:#" in page
    assert FeatureActivations.from_wire(view.to_wire()).top_values.equal(view.top_values)


def test_the_default_colouring_passes_over_the_first_tokens_sink():
    from workbench.inspect import FeatureActivations

    def view(positions, values):
        ids = torch.tensor([[7, 1], [3, 2], [5, 4]])[:len(positions)]
        return FeatureActivations("s", HOOK, D_SAE, ["a", "b", "c"], positions, ids,
                                  torch.tensor(values), [], torch.zeros(len(positions), 0),
                                  [2] * len(positions), [0.0] * len(positions))

    sink = view([0, 1, 2], [[90.0, 1.0], [2.0, 1.0], [6.0, 1.0]])
    assert sink.strongest() == 5  # not 7, the attention sink's at position 0
    assert view([0], [[90.0, 1.0]]).strongest() == 7  # the only position read
    assert view([0, 1], [[9.0, 0.0], [0.0, 0.0]]).strongest() == 7  # nothing later is active
    assert view([0, 1], [[0.0, 0.0], [0.0, 0.0]]).strongest() is None


def test_sparse_activations_decode_row_by_row_to_the_same_sum(tmp_path):
    """At most one feature in `SPARSE_DECODE` active: each row adds its active features'
    decoder rows (float32 rounding apart from the dense product)."""
    from workbench.features.sae import SPARSE_DECODE

    sae = SparseAutoencoder.load("s", save_sae(str(tmp_path / "s"), weights("topk"), HOOK,
                                               "topk", k=2))
    acts = sae.encode(torch.randn(5, D_IN, generator=torch.Generator().manual_seed(2)))
    assert int((acts > 0).sum()) * SPARSE_DECODE <= acts.numel()
    dense = acts @ sae.weights["W_dec"] + sae.weights["b_dec"]
    torch.testing.assert_close(sae.decode(acts), dense, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sae.decode(acts[None]), dense[None], rtol=1e-5, atol=1e-6)


def _spliced_reference(sae_weights, cfg, prompt, feature, value, steps):
    """SAELens's HookedSAETransformer with `use_error_term=True`, in plain torch on
    transformers' own model: at the SAE's hook, decode(acts with the feature set) + (x -
    decode(acts)); greedy tokens and their logprobs."""
    from workbench.models import tiny_model

    model = tiny_model("llama", seed=0, dtype="float32").model

    def splice(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        acts = saelens_encode(sae_weights, cfg, x)
        edited = acts.clone()
        edited[..., feature] = value
        out = edited @ sae_weights["W_dec"] + sae_weights["b_dec"] + (
            x - (acts @ sae_weights["W_dec"] + sae_weights["b_dec"]))
        return ((out, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": out})

    handle = model.model.layers[1].register_forward_pre_hook(splice, with_kwargs=True)
    try:
        done = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,
                              output_scores=True, return_dict_in_generate=True)
    finally:
        handle.remove()
    tokens = done.sequences[0, len(prompt):].tolist()
    logprobs = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(done.scores, tokens)]
    return tokens, logprobs


@pytest.mark.parametrize("op, value", [("set", 6.0), ("zero", 0.0)])
def test_clamping_or_ablating_a_feature_is_the_spliced_sae_with_its_error_term(llm, sae_dir, op,
                                                                                value):
    from safetensors.torch import load_file

    cfg = json.loads(open(f"{sae_dir}/cfg.json").read())
    sae_weights = load_file(f"{sae_dir}/sae_weights.safetensors")
    prompt = ids_of(llm.llm_engine.loaded, "Clamp this feature, please")
    acts = llm.saes["s"].encode(llm.generate([{"prompt_token_ids": prompt}], greedy(
        1, capture={"sites": [HOOK]}))[0].activations[HOOK])
    feature = int(acts.sum(0).argmax())  # active in this prompt: ablating it changes something
    edit = {"feature": {"sae": "s", "index": feature}, "op": op}
    if op == "set":
        edit["value"] = value
    out = llm.generate([{"prompt_token_ids": prompt}], greedy(
        6, logprobs=0, interventions=[edit]))[0].outputs[0]
    tokens, logprobs = _spliced_reference(sae_weights, cfg, prompt, feature, value, 6)
    assert out.token_ids == tokens
    ours = [lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids)]
    assert ours == pytest.approx(logprobs, abs=1e-4)
    plain = llm.generate([{"prompt_token_ids": prompt}], greedy(6, logprobs=0))[0].outputs[0]
    assert [lp[t].logprob for lp, t in zip(plain.logprobs, plain.token_ids)] != ours


def test_feature_ops_are_checked_by_name(llm):
    for edit, field in [({"op": "set"}, "interventions[0].value"),
                        ({"op": "set", "value": 1.0, "scale": 2.0}, "interventions[0].scale"),
                        ({"op": "zero", "value": 1.0}, "interventions[0].value"),
                        ({"op": "zero", "scale": 2.0}, "interventions[0].scale"),
                        ({"op": "scale"}, "interventions[0].op"),
                        ({"site": "resid_post"}, "interventions[0].feature")]:
        with pytest.raises(ValidationError) as error:
            SamplingParams(max_tokens=1, interventions=[
                {"feature": {"sae": "s", "index": 1}, **edit}])
        assert error.value.parameter == field, edit
    with pytest.raises(ValidationError) as error:
        SamplingParams(max_tokens=1, interventions=[
            {"site": "resid_post", "layer": 0, "op": "add", "vector": [0.0] * 64, "value": 1}])
    assert error.value.parameter == "interventions[0].value"


def test_a_reloaded_sae_is_another_for_the_prefix_cache(tmp_path):
    """A clamp's KV depends on the SAE's weights: the same name loaded again (other weights)
    gives its requests another interventions digest, so no cached block is shared."""
    from workbench.inside.resolve import ModelShape, resolve
    from workbench.inside.spec import Intervention

    edit = Intervention.parse({"feature": {"sae": "x", "index": 3}, "op": "zero"}, 0)
    keys = []
    for seed in (1, 2):
        sae = SparseAutoencoder.load("x", save_sae(str(tmp_path / str(seed)), weights(
            "standard", seed=seed), HOOK))
        shape = ModelShape(2, D_IN, 4, 16, 100, saes={"x": sae})
        keys.append(resolve(None, None, [edit], shape, 8).key)
    assert keys[0] != keys[1]


def test_an_saes_hooks_are_capture_sites_in_saelens_names(llm):
    """`blocks.1.hook_resid_pre.hook_sae_acts_post` and the other hooks of the SAE spliced at
    a site: what SAELens's hooks hold, computed from the site's rows (recorded whether the site
    itself is asked for or not)."""
    prompt = ids_of(llm.llm_engine.loaded, "A spliced SAE")
    names = [f"{HOOK}.hook_sae_{h}" for h in ("input", "acts_pre", "acts_post", "recons",
                                               "error", "output")]
    cache = llm.generate([{"prompt_token_ids": prompt}], greedy(
        3, capture={"sites": names}))[0].activations
    assert list(cache.tensors) == names  # the site itself was not asked for
    x = llm.generate([{"prompt_token_ids": prompt}], greedy(
        3, capture={"sites": [HOOK]}))[0].activations[HOOK]
    sae = llm.saes["s"]
    acts = sae.encode(x)
    assert torch.equal(cache[f"{HOOK}.hook_sae_input"], x)
    assert torch.equal(cache[f"{HOOK}.hook_sae_output"], x)
    assert torch.equal(cache[f"{HOOK}.hook_sae_acts_post"], acts)
    assert cache[f"{HOOK}.hook_sae_acts_pre"].shape == (x.shape[0], D_SAE)
    recons = sae.decode(acts, x)
    assert torch.equal(cache[f"{HOOK}.hook_sae_recons"], recons)
    assert torch.equal(cache[f"{HOOK}.hook_sae_error"], x - recons)
    reduced = llm.generate([{"prompt_token_ids": prompt}], greedy(3, capture={
        "sites": [f"{HOOK}.hook_sae_acts_post"], "reduce": "mean"}))[0].activations
    assert torch.equal(reduced[f"{HOOK}.hook_sae_acts_post"], acts.mean(0))


@pytest.mark.parametrize("site, message", [
    ("blocks.0.hook_resid_pre.hook_sae_acts_post", "needs one SAE loaded there; none is"),
    ("resid_pre.hook_sae_acts_post", "names its site in full"),
    (f"{HOOK}.hook_sae_nope", "an SAE's hook is one of"),
    ("blocks.9.hook_resid_pre.hook_sae_error", "out of range"),
])
def test_an_sae_hook_without_its_sae_is_refused(llm, site, message):
    with pytest.raises(ValidationError, match=message) as error:
        llm.generate([{"prompt_token_ids": [1, 2]}], greedy(1, capture={"sites": [site]}))
    assert error.value.parameter == "capture.sites"


def test_an_saes_features_can_be_captured_sparse(llm, tmp_path):
    """`capture={"sites": [...acts_post], "sparse": True}`: sparse COO tensors equal to the dense
    capture; a TopK SAE's counted against the capture limit at its k a row."""
    from workbench.inside.resolve import ModelShape, resolve
    from workbench.inside.spec import CaptureParams

    prompt = ids_of(llm.llm_engine.loaded, "A sparse read")
    site = f"{HOOK}.hook_sae_acts_post"
    dense = llm.generate([{"prompt_token_ids": prompt}], greedy(
        3, capture={"sites": [site, HOOK]}))[0].activations
    sparse = llm.generate([{"prompt_token_ids": prompt}], greedy(
        3, capture={"sites": [site, HOOK], "sparse": True}))[0].activations
    assert sparse[site].is_sparse and not sparse[HOOK].is_sparse
    assert torch.equal(sparse[site].to_dense(), dense[site])
    nnz = int((dense[site] != 0).sum())
    assert sparse.nbytes == dense.nbytes - dense[site].numel() * 4 + nnz * 20
    assert sparse.to_frame().equals(dense.to_frame())
    assert "sparse" in sparse._repr_html_()
    topk = SparseAutoencoder.load("k", save_sae(str(tmp_path / "k"), weights("topk"), HOOK,
                                                "topk", k=4))
    shape = ModelShape(2, D_IN, 4, 16, 100, saes={"k": topk})
    sizes = [resolve(CaptureParams.parse({"sites": [site], "sparse": s}), None, [], shape,
                     10).nbytes for s in (False, True)]
    assert sizes == [10 * D_SAE * 4, 10 * 4 * 20]


@pytest.mark.parametrize("capture", [
    {"sites": [HOOK], "sparse": True},
    {"sites": [f"{HOOK}.hook_sae_acts_pre"], "sparse": True},
    {"sites": [f"{HOOK}.hook_sae_acts_post"], "sparse": True, "reduce": "mean"},
    {"sites": [f"{HOOK}.hook_sae_acts_post"], "sparse": 1},
])
def test_sparse_is_for_an_saes_features_per_position(capture):
    with pytest.raises(ValidationError) as error:
        SamplingParams(max_tokens=1, capture=capture)
    assert error.value.parameter == "capture.sparse"


def test_capture_sae_names_which_of_several_saes_at_a_hook(llm, tmp_path):
    llm.load_sae("twin", save_sae(str(tmp_path / "twin"), weights("standard", seed=8), HOOK))
    try:
        site = f"{HOOK}.hook_sae_acts_post"
        with pytest.raises(ValidationError, match=r"2 are \(s, twin\): name one with capture.sae"):
            llm.generate([{"prompt_token_ids": [1, 2, 3]}], greedy(1, capture={"sites": [site]}))
        rows = llm.generate([{"prompt_token_ids": [1, 2, 3]}], greedy(1, capture={
            "sites": [site, HOOK], "sae": "twin"}))[0].activations
        assert torch.equal(rows[site], llm.saes["twin"].encode(rows[HOOK]))
        with pytest.raises(ValidationError, match="is spliced at") as error:
            llm.generate([{"prompt_token_ids": [1, 2]}], greedy(1, capture={
                "sites": ["blocks.0.hook_resid_pre.hook_sae_acts_post"], "sae": "twin"}))
        assert error.value.parameter == "capture.sae"
        with pytest.raises(ValidationError) as error:
            SamplingParams(max_tokens=1, capture={"sites": [HOOK], "sae": "twin"})
        assert error.value.parameter == "capture.sae"
    finally:
        llm.unload_sae("twin")
