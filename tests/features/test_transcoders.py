"""Transcoders (SAELens 6's `transcoder`, `jumprelu_transcoder`, `skip_transcoder`,
`jumprelu_skip_transcoder`: read one hook, write another) and splicing an SAE in
(`{"sae": name, "op": "splice"}`), against SAELens's arithmetic transcribed below from its
`sae_lens/saes/transcoder.py` and `analysis/hooked_sae_transformer.py` in plain torch, on
transformers' own model with hooks.

The transcoder here reads `blocks.1.hook_resid_mid` (the input of layer 1's MLP norm) and
writes `blocks.1.hook_mlp_out` (the MLP's output)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.engine.helpers import greedy, ids_of, make_llm
from tests.features.test_sae import HOOK, saelens_encode
from tests.features.test_sae import weights as sae_weights
from workbench.errors import ValidationError
from workbench.features.sae import TRANSCODERS, SparseAutoencoder, save_sae

D, D_SAE = 64, 96
IN, OUT = "blocks.1.hook_resid_mid", "blocks.1.hook_mlp_out"


def tc_weights(architecture: str, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {"W_enc": torch.randn(D, D_SAE, generator=gen) / math.sqrt(D),
           "b_enc": torch.randn(D_SAE, generator=gen) * 0.1,
           "W_dec": torch.randn(D_SAE, D, generator=gen) / math.sqrt(D_SAE),
           "b_dec": torch.randn(D, generator=gen) * 0.1}
    if "jumprelu" in architecture:
        out["threshold"] = torch.rand(D_SAE, generator=gen) * 0.3
    if "skip" in architecture:
        out["W_skip"] = torch.randn(D, D, generator=gen) * 0.05
    return out


def save_tc(path, architecture: str, seed: int = 0, hook_in: str = IN, hook_out: str = OUT,
            **config) -> str:
    return save_sae(str(path), tc_weights(architecture, seed), hook_in, architecture,
                    metadata={"hook_name_out": hook_out}, **config)


def saelens_transcoder(w, architecture, x):
    """SAELens 6's Transcoder: `encode` (no b_dec subtracted), `decode` (acts W_dec + b_dec),
    `forward` (a skip transcoder adds x W_skip^T)."""
    hidden_pre = x.float() @ w["W_enc"] + w["b_enc"]
    acts = torch.relu(hidden_pre)
    if "jumprelu" in architecture:
        acts = acts * (hidden_pre > w["threshold"]).float()
    recons = acts @ w["W_dec"] + w["b_dec"]
    forward = recons + x.float() @ w["W_skip"].T if "skip" in architecture else recons
    return acts, recons, forward


@pytest.mark.parametrize("architecture", TRANSCODERS)
def test_encode_decode_and_output_are_saelens_arithmetic(tmp_path, architecture):
    sae = SparseAutoencoder.load("t", save_tc(tmp_path / "t", architecture, seed=1))
    assert sae.transcoder and sae.writes == ("mlp_out", 1) and (sae.site, sae.layer) == (
        "resid_mid", 1)
    assert sae.describe()["hook_name_out"] == OUT
    x = torch.randn(9, D, generator=torch.Generator().manual_seed(2)) * 3
    acts, recons, forward = saelens_transcoder(tc_weights(architecture, 1), architecture, x)
    ours = sae.encode(x)
    assert (ours - acts).abs().max() <= 1e-6 * acts.abs().max()
    assert torch.equal(ours > 0, acts > 0)
    torch.testing.assert_close(sae.decode(ours, x), recons, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sae.output(x), forward, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config, message", [
    ({"metadata": {}}, "names the hook it writes"),
    ({"metadata": {"hook_name_out": "blocks.0.hook_mlp_out"}}, "writes after it reads"),
    ({"metadata": {"hook_name_out": IN}}, "writes after it reads"),
    ({"metadata": {"hook_name_out": "blocks.1.attn.hook_z"}}, "SAEs are served on"),
    ({"normalize_activations": "layer_norm"}, "never undoes it"),
    ({"apply_b_dec_to_input": True}, "apply_b_dec_to_input"),
])
def test_a_transcoder_that_cannot_be_served_is_refused_at_load(tmp_path, config, message):
    metadata = config.pop("metadata", {"hook_name_out": OUT})
    path = save_sae(str(tmp_path / "t"), tc_weights("transcoder"), IN, "transcoder",
                    metadata=metadata, **config)
    with pytest.raises(ValidationError, match=message):
        SparseAutoencoder.load("t", path)


def test_a_transcoders_shapes_are_its_d_out(tmp_path):
    w = tc_weights("skip_transcoder")
    w["W_skip"] = w["W_skip"][:, :32]
    path = save_sae(str(tmp_path / "t"), w, IN, "skip_transcoder",
                    metadata={"hook_name_out": OUT})
    with pytest.raises(ValidationError, match=r"W_skip must be \[64, 64\]"):
        SparseAutoencoder.load("t", path)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from workbench.models import tiny_model

    root = tmp_path_factory.mktemp("transcoders")
    return make_llm(tiny_model("llama", seed=0, dtype="float32"), saes={
        "t": save_tc(root / "t", "jumprelu_skip_transcoder", seed=3),
        "s": save_sae(str(root / "s"), sae_weights("standard", seed=4), HOOK)})


def test_a_transcoder_made_for_another_model_is_refused_naming_its_output(tmp_path, llm):
    path = save_tc(tmp_path / "deep", "transcoder", hook_out="blocks.5.hook_mlp_out")
    with pytest.raises(ValidationError, match="blocks.5.hook_mlp_out' is past the model's"):
        llm.load_sae("deep", path)
    assert sorted(llm.saes) == ["s", "t"]


def _transformers_run(prompt, steps, edit):
    """Greedy tokens and logprobs of transformers' own tiny llama with `edit(x_in, out)` ->
    the new MLP output of layer 1 (x_in: the rows entering its MLP norm)."""
    from workbench.models import tiny_model

    model = tiny_model("llama", seed=0, dtype="float32").model
    layer, seen = model.model.layers[1], {}
    handles = [
        layer.post_attention_layernorm.register_forward_pre_hook(
            lambda module, args: seen.__setitem__("x", args[0])),
        layer.mlp.register_forward_hook(lambda module, args, out: edit(seen["x"], out))]
    try:
        done = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,
                              output_scores=True, return_dict_in_generate=True)
    finally:
        for handle in handles:
            handle.remove()
    tokens = done.sequences[0, len(prompt):].tolist()
    return tokens, [float(torch.log_softmax(s[0].float(), -1)[t])
                    for s, t in zip(done.scores, tokens)]


def _ours(out):
    first = out.outputs[0]
    return first.token_ids, [lp[t].logprob for lp, t in zip(first.logprobs, first.token_ids)]


def test_features_read_the_input_hook_and_the_error_is_of_the_output_hook(llm):
    prompt = ids_of(llm.llm_engine.loaded, "The quick brown fox jumps")
    out = llm.generate([{"prompt_token_ids": prompt}], greedy(
        4, features={"sae": "t", "top_k": 5, "indices": [1, 50]},
        capture={"sites": [IN, OUT]}))[0]
    data, x_in, x_out = out.features, out.activations[IN], out.activations[OUT]
    sae = llm.saes["t"]
    acts = sae.encode(x_in)
    top = acts.topk(5, dim=-1)
    assert data.hook_name == IN
    assert data.top_ids.tolist() == top.indices.tolist()
    assert (data.top_values - top.values).abs().max() <= 1e-6 * acts.abs().max()
    assert data.l0 == (acts > 0).sum(-1).tolist()
    errors = (x_out - sae.output(x_in)).norm(dim=-1)
    assert data.error_norm == pytest.approx(errors.tolist(), rel=1e-5)


def test_a_transcoders_hooks_are_capture_sites_at_its_output_hook(llm):
    """SAELens names a transcoder's hooks at the hook it writes (its wrapper sits there):
    `hook_sae_input` the input hook's rows, `hook_sae_recons` decode (W_skip not in it), the
    error and output of the output hook."""
    prompt = ids_of(llm.llm_engine.loaded, "A spliced transcoder")
    names = [f"{OUT}.hook_sae_{h}" for h in ("input", "acts_post", "recons", "error", "output")]
    cache = llm.generate([{"prompt_token_ids": prompt}], greedy(
        3, capture={"sites": names}))[0].activations
    assert list(cache.tensors) == names
    rows = llm.generate([{"prompt_token_ids": prompt}], greedy(
        3, capture={"sites": [IN, OUT]}))[0].activations
    sae = llm.saes["t"]
    acts = sae.encode(rows[IN])
    assert torch.equal(cache[f"{OUT}.hook_sae_input"], rows[IN])
    assert torch.equal(cache[f"{OUT}.hook_sae_acts_post"], acts)
    assert torch.equal(cache[f"{OUT}.hook_sae_recons"], sae.decode(acts))
    assert torch.equal(cache[f"{OUT}.hook_sae_error"], rows[OUT] - sae.decode(acts))
    assert torch.equal(cache[f"{OUT}.hook_sae_output"], rows[OUT])
    with pytest.raises(ValidationError, match="needs one SAE loaded there; none is"):
        llm.generate([{"prompt_token_ids": prompt}], greedy(
            1, capture={"sites": [f"{IN}.hook_sae_acts_post"]}))


def test_steering_by_a_transcoder_feature_adds_its_row_at_the_output_hook(llm):
    prompt = ids_of(llm.llm_engine.loaded, "Once upon a time")
    row = llm.saes["t"].weights["W_dec"][11]
    by_feature = llm.generate([{"prompt_token_ids": prompt}], greedy(6, logprobs=1, interventions=[
        {"feature": {"sae": "t", "index": 11}, "scale": 30.0}]))[0].outputs[0]
    by_vector = llm.generate([{"prompt_token_ids": prompt}], greedy(6, logprobs=1, interventions=[
        {"site": "mlp_out", "layer": 1, "op": "add", "vector": row.tolist(),
         "scale": 30.0}]))[0].outputs[0]
    assert by_feature.token_ids == by_vector.token_ids
    assert list(by_feature.logprobs) == list(by_vector.logprobs)


@pytest.mark.parametrize("op, value", [("set", 5.0), ("zero", 0.0)])
def test_clamping_a_transcoder_feature_is_saelens_splice_with_its_error_term(llm, op, value):
    sae, w = llm.saes["t"], tc_weights("jumprelu_skip_transcoder", 3)
    prompt = ids_of(llm.llm_engine.loaded, "Clamp this transcoder feature")
    x_in = llm.generate([{"prompt_token_ids": prompt}], greedy(
        1, capture={"sites": [IN]}))[0].activations[IN]
    feature = int(sae.encode(x_in).sum(0).argmax())
    edit = {"feature": {"sae": "t", "index": feature}, "op": op}
    if op == "set":
        edit["value"] = value

    def reference(x, out):  # decode(edited) + (out - decode(clean)), SAELens's wrapper
        acts, recons, _ = saelens_transcoder(w, "jumprelu_skip_transcoder", x)
        edited = acts.clone()
        edited[..., feature] = value
        return edited @ w["W_dec"] + w["b_dec"] + (out - recons)

    tokens, logprobs = _transformers_run(prompt, 6, reference)
    ours = _ours(llm.generate([{"prompt_token_ids": prompt}], greedy(
        6, logprobs=0, interventions=[edit]))[0])
    assert ours[0] == tokens
    assert ours[1] == pytest.approx(logprobs, abs=1e-4)
    plain = _ours(llm.generate([{"prompt_token_ids": prompt}], greedy(6, logprobs=0))[0])
    assert plain[1] != ours[1]


def test_splicing_a_transcoder_writes_its_output_at_the_output_hook(llm):
    w = tc_weights("jumprelu_skip_transcoder", 3)
    prompt = ids_of(llm.llm_engine.loaded, "Replace the MLP with its transcoder")
    tokens, logprobs = _transformers_run(
        prompt, 6, lambda x, out: saelens_transcoder(w, "jumprelu_skip_transcoder", x)[2])
    ours = _ours(llm.generate([{"prompt_token_ids": prompt}], greedy(
        6, logprobs=0, interventions=[{"sae": "t", "op": "splice"}]))[0])
    assert ours[0] == tokens
    assert ours[1] == pytest.approx(logprobs, abs=1e-4)


def test_splicing_an_sae_replaces_its_hook_by_the_reconstruction(llm):
    """SAELens's HookedSAETransformer with `use_error_term=False`: x -> decode(encode(x))."""
    from safetensors.torch import load_file

    from workbench.models import tiny_model

    sae = llm.saes["s"]
    w = load_file(f"{sae.path}/sae_weights.safetensors")
    cfg = {"architecture": "standard", "d_in": D}
    prompt = ids_of(llm.llm_engine.loaded, "Splice the SAE in")
    model = tiny_model("llama", seed=0, dtype="float32").model

    def splice(module, args):
        return (saelens_encode(w, cfg, args[0]) @ w["W_dec"] + w["b_dec"], *args[1:])

    handle = model.model.layers[1].register_forward_pre_hook(splice)
    try:
        done = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                              output_scores=True, return_dict_in_generate=True)
    finally:
        handle.remove()
    tokens = done.sequences[0, len(prompt):].tolist()
    ours = _ours(llm.generate([{"prompt_token_ids": prompt}], greedy(
        6, logprobs=0, interventions=[{"sae": "s", "op": "splice"}]))[0])
    assert ours[0] == tokens
    assert ours[1] == pytest.approx([float(torch.log_softmax(s[0], -1)[t]) for s, t in zip(
        done.scores, tokens)], abs=1e-4)
    only_last = _ours(llm.generate([{"prompt_token_ids": prompt}], greedy(
        6, logprobs=0, interventions=[{"sae": "s", "op": "splice", "positions": "generated"}]))[0])
    assert only_last[1] != ours[1]  # positions are honoured


@pytest.mark.parametrize("edit, field", [
    ({"sae": "nope", "op": "splice"}, "interventions[0].sae"),
    ({"sae": "s", "op": "add"}, "interventions[0].op"),
    ({"sae": "s"}, "interventions[0].op"),
    ({"sae": "s", "op": "splice", "scale": 2.0}, "interventions[0].sae"),
    ({"sae": 3, "op": "splice"}, "interventions[0].sae"),
    ({"site": "resid_pre", "layer": 1, "op": "splice"}, "interventions[0].op"),
])
def test_a_bad_splice_is_refused_by_name(llm, edit, field):
    with pytest.raises(ValidationError) as error:
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], greedy(2, interventions=[edit]))
    assert error.value.parameter == field


def test_a_splice_in_a_batch_leaves_the_other_requests_as_they_were(llm):
    prompts = [ids_of(llm.llm_engine.loaded, t) for t in ("Hello there", "One two three four")]
    alone = llm.generate([{"prompt_token_ids": prompts[1]}], greedy(6, logprobs=2))[0]
    both = llm.generate([{"prompt_token_ids": p} for p in prompts], [
        greedy(6, interventions=[{"sae": "t", "op": "splice"}]), greedy(6, logprobs=2)])
    assert list(both[1].outputs[0].logprobs) == list(alone.outputs[0].logprobs)


@pytest.mark.parametrize("name", ["Transcoder", "SkipTranscoder", "JumpReLUTranscoder",
                                  "JumpReLUSkipTranscoder"])
def test_a_transcoder_saelens_saved_loads_and_computes_as_saelens(tmp_path, name):
    """SAELens's own class, saved by SAELens (`save_model`), read by our loader: its `encode`
    and `forward` (`output`), within float32 rounding of the scale."""
    sae_lens = pytest.importorskip("sae_lens")
    cls, config = getattr(sae_lens, name), getattr(sae_lens, f"{name}Config")
    cfg = config(d_in=D, d_sae=D_SAE, d_out=D, apply_b_dec_to_input=False)
    cfg.metadata.hook_name, cfg.metadata.hook_name_out = IN, OUT
    theirs = cls(cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    theirs.save_model(str(tmp_path))
    ours = SparseAutoencoder.load("t", str(tmp_path))
    x = torch.randn(9, D, generator=torch.Generator().manual_seed(1)) * 3
    acts, out = theirs.encode(x).detach(), theirs(x).detach()
    assert ours.writes == ("mlp_out", 1)
    assert (ours.encode(x) - acts).abs().max() <= 1e-6 * acts.abs().max()
    assert (ours.output(x) - out).abs().max() <= 1e-6 * out.abs().max()
