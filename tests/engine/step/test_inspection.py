"""Inside the model per request: captures, attention patterns, the logit lens and interventions
(`workbench/inside/`, `engine/step/inspection.py`), exact against transformers.

Activations equal transformers' `output_hidden_states` (and its modules' outputs, through forward
hooks on an untouched copy) to within a few float32 ulps of their scale, for a request batched
with others, chunked, preempted and behind a warm prefix cache; patterns equal the eager
attention's `output_attentions`; an intervened request equals transformers with a forward hook
doing the same; and every request beside it is bit-identical to a run without it.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from tests.engine.helpers import make_llm
from workbench.errors import ValidationError
from workbench.models.architectures import ARCHITECTURES, architecture_of, module_at, sites_of
from workbench.models.tiny import tiny_model
from workbench.sampling_params import SamplingParams

PROMPTS = ["Once upon a time there was", "The capital of France is", "hello"]


def close(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Within 1e-5 of the reference's largest magnitude: float32 rounding, what different
    kernels' summation orders leave after a few layers (measured: at most 4.4e-6, gemma2)."""
    scale = max(1.0, ref.abs().max().item())
    assert got.shape == ref.shape
    assert (got - ref.float()).abs().max().item() <= 1e-5 * scale


def pristine(family: str = "llama", **overrides):
    loaded = tiny_model(family, **overrides)
    return loaded, dataclasses.replace(loaded, model=copy.deepcopy(loaded.model))


def greedy(n: int = 4, **inside) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=2, **inside)


def sequence(out) -> list[int]:
    """The tokens that went through the model: the prompt and all but the last sampled."""
    return out.prompt_token_ids + out.outputs[0].token_ids[:-1]


@torch.inference_mode()
def hidden_states(ref, ids: list[int]):
    return ref.model(torch.tensor([ids]), output_hidden_states=True).hidden_states


@torch.inference_mode()
def module_outputs(ref, ids: list[int]) -> dict[str, torch.Tensor]:
    """transformers' own values at each site of each layer, by forward hooks."""
    cfg = ref.model.config
    arch = architecture_of(cfg)
    sites, missing = sites_of(arch, cfg)
    got: dict[str, torch.Tensor] = {}
    handles = []

    def keep(name, pre=False):
        def hook(module, args, out=None):
            value = args[0] if pre else (out[0] if isinstance(out, tuple) else out)
            got[name] = value.reshape(-1, value.shape[-1])[-len(ids):].clone()  # OPT: [B*T, W]
        return hook

    for i, layer in enumerate(module_at(ref.model, arch.layers)):
        handles.append(layer.register_forward_hook(keep(f"blocks.{i}.hook_resid_post")))
        handles.append(module_at(layer, sites.attn_out).register_forward_hook(
            keep(f"blocks.{i}.hook_attn_out")))
        handles.append(module_at(layer, sites.mlp_out).register_forward_hook(
            keep(f"blocks.{i}.hook_mlp_out")))
        if "resid_mid" not in missing:
            handles.append(module_at(layer, sites.resid_mid).register_forward_pre_hook(
                keep(f"blocks.{i}.hook_resid_mid", pre=True)))
    try:
        ref.model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return got


@pytest.mark.parametrize("family", sorted(ARCHITECTURES))
def test_captured_residual_stream_equals_transformers_hidden_states(family):
    """Every family: resid_pre of each layer is transformers' hidden_states[l], the final norm's
    output its last; the residual sites and the sublayer outputs equal its modules' outputs."""
    loaded, ref = pristine(family)
    cfg = ref.model.config
    sites = ["resid_pre", "resid_post", "attn_out", "mlp_out", "normalized"]
    if "resid_mid" not in sites_of(architecture_of(cfg), cfg)[1]:
        sites.append("resid_mid")
    params = [greedy(capture={"sites": sites}), greedy(), greedy(capture={"sites": sites})]
    outs = make_llm(loaded).generate(PROMPTS, params)
    for out in (outs[0], outs[2]):
        ids = sequence(out)
        cache = out.activations
        assert cache.positions == list(range(len(ids)))
        states = hidden_states(ref, ids)
        for layer in range(cfg.num_hidden_layers):
            close(cache["resid_pre", layer], states[layer][0])
        close(cache["ln_final.hook_normalized"], states[-1][0])
        for name, value in module_outputs(ref, ids).items():
            close(cache[name], value)


def test_the_last_sampled_token_is_stated_missing_and_reductions_reduce():
    loaded, ref = pristine()
    out_all, out_mean, out_last = make_llm(loaded).generate(["Once upon a time"] * 3, [
        greedy(3, capture={"sites": ["resid_post"], "layers": [-1]}),
        greedy(3, capture={"sites": ["resid_post"], "layers": [-1], "reduce": "mean"}),
        greedy(3, capture={"sites": ["blocks.1.hook_resid_post"], "reduce": "last",
                           "positions": "prompt"})])
    total = len(out_all.prompt_token_ids) + 3
    assert any(str(total - 1) in key for key in out_all.activations.missing)
    full = out_all.activations["resid_post", -1]
    assert full.shape[0] == total - 1
    close(out_mean.activations["resid_post", 1], full.mean(0))
    prompt_last = len(out_all.prompt_token_ids) - 1
    close(out_last.activations["resid_post", 1], full[prompt_last])


def test_capture_is_exact_across_chunked_prefill_preemption_and_a_warm_prefix_cache():
    """Chunks of 5 tokens behind a warm prefix cache (the same prompt run before), then a KV
    cache too small for every request at once (preemption and recompute): the same
    activations as the request alone, every position present, the cached prefix recomputed."""
    loaded, ref = pristine()
    prompt = "one two three four five six seven eight nine ten eleven twelve thirteen"
    capture = {"sites": ["resid_post", "attn_out", "pattern"]}
    alone = make_llm(dataclasses.replace(ref, model=copy.deepcopy(ref.model))).generate(
        [prompt], greedy(16, capture=capture))[0]
    chunked = make_llm(loaded, max_num_batched_tokens=5, block_size=4, num_kv_blocks=64)
    chunked.generate([prompt], greedy(2))  # its prefix now in the cache
    tight = make_llm(dataclasses.replace(ref, model=copy.deepcopy(ref.model)), block_size=4,
                     num_kv_blocks=14, max_model_len=48)
    for llm in (chunked, tight):
        outs = llm.generate([prompt, prompt, prompt, PROMPTS[1]],
                            [greedy(16, capture=capture), greedy(16),
                             greedy(16, capture=capture), greedy(16)])
        for out in (outs[0], outs[2]):
            assert out.num_cached_tokens == 0
            assert out.outputs[0].token_ids == alone.outputs[0].token_ids
            assert out.activations.positions == alone.activations.positions
            for name in alone.activations:
                close(out.activations[name], alone.activations[name])
    assert chunked.llm_engine.block_manager.prefix_hits > 0  # the plain one used it
    assert tight.llm_engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("family, overrides", [
    ("llama", {}), ("gpt2", {}), ("mistral", {"sliding_window": 4}),
    ("gemma2", {"sliding_window": 4}), ("bloom", {}), ("gpt_neox", {})])
# Falcon is left out: transformers cannot switch it to eager attention, and the probabilities
# its `output_attentions` branch returns are not the ones it generates with (measured: no
# causal mask without ALiBi; with ALiBi the bias added twice, the mask it builds already holding
# alibi / sqrt(d)). Ours are those its SDPA path uses: its generation is tested equal.
def test_attention_patterns_equal_eager_output_attentions(family, overrides):
    """The probabilities of every head (grouped-query heads mapped), windows, soft-capping and
    ALiBi included, as transformers' eager attention returns them."""
    loaded, ref = pristine(family, **overrides)
    cfg = ref.model.config
    capture = {"sites": ["pattern"], "layers": [0, -1]}
    outs = make_llm(loaded).generate(PROMPTS[:2], [greedy(4, capture=capture), greedy(4)])
    ids = sequence(outs[0])
    ref.model.set_attn_implementation("eager")
    with torch.inference_mode():
        attentions = ref.model(torch.tensor([ids]), output_attentions=True).attentions
    for layer in (0, cfg.num_hidden_layers - 1):
        pattern = outs[0].activations["pattern", layer]  # [H, Q, K]
        expected = attentions[layer][0]  # [H, T, T]
        assert pattern.shape == expected.shape
        assert (pattern - expected.float()).abs().max().item() < 1e-6


def test_pattern_heads_and_query_positions_are_chosen():
    loaded, _ = pristine()
    out = make_llm(loaded).generate([PROMPTS[0]], greedy(2, capture={
        "sites": ["blocks.1.attn.hook_pattern"], "heads": [1],
        "positions": {"start": 2, "stop": 4}}))[0]
    pattern = out.activations["pattern", 1]
    assert pattern.shape == (1, 2, 4)  # one head, queries 2 and 3, keys 0..3
    assert out.activations.positions == [2, 3]
    torch.testing.assert_close(pattern.sum(-1), torch.ones(1, 2))
    listed = make_llm(loaded).generate([PROMPTS[0]], greedy(2, capture={
        "sites": ["blocks.1.attn.hook_pattern", "blocks.0.hook_resid_post"], "heads": [1],
        "positions": [4, 2]}))[0].activations  # a list: those two positions, not a range
    assert listed.positions == [2, 4]
    assert listed["pattern", 1].shape == (1, 2, 5)  # queries 2 and 4, keys 0..4
    torch.testing.assert_close(listed["pattern", 1][0, 0, :4], pattern[0, 0])  # query 2
    assert listed["resid_post", 0].shape[0] == 2


def test_logit_lens_at_the_last_layer_is_the_output_distribution():
    loaded, ref = pristine()
    lens_ids = [5, 17]
    out = make_llm(loaded).generate([PROMPTS[1]], greedy(3, logit_lens={
        "top_k": 2, "token_ids": lens_ids}))[0]
    lens = out.logit_lens
    assert lens.layers == [0, 1]
    ids = sequence(out)
    states = hidden_states(ref, ids)
    with torch.inference_mode():
        model = ref.model
        for li, layer in enumerate(lens.layers):
            resid = states[layer + 1][0] if layer + 1 < len(states) - 1 else None
            if resid is None:  # the last layer's output: before the final norm
                resid = module_outputs(ref, ids)[f"blocks.{layer}.hook_resid_post"]
            probs = torch.softmax(model.lm_head(model.model.norm(resid)).float(), -1)  # [T, V]
            top = probs.topk(2, dim=-1)
            assert (lens.top_probs[li] - top.values).abs().max() < 1e-6
            # the same tokens, or ones the reference ties with them (a random model is flat)
            assert (probs.gather(-1, lens.top_ids[li]) - top.values).abs().max() < 1e-6
            for t in lens_ids:
                p, ours = probs[:, t:t + 1], lens.token_ranks[t][li]
                # the reference's rank, give or take the tokens within float rounding of it
                assert ((probs > p + 1e-7).sum(-1) <= ours).all()
                assert (ours <= (probs > p - 1e-7).sum(-1)).all()
    # the last layer's top token at the last prompt position is what was generated first
    last_prompt = len(out.prompt_token_ids) - 1
    assert lens.top_ids[-1, lens.positions.index(last_prompt), 0] == out.outputs[0].token_ids[0]


def _hook_reference(ref, ids: list[int], hooks, tokens: int) -> tuple[list[int], list]:
    """transformers' greedy continuation with `hooks` [(module, pre?, fn)] installed."""
    handles = [m.register_forward_pre_hook(fn) if pre else m.register_forward_hook(fn)
               for m, pre, fn in hooks]
    try:
        with torch.inference_mode():
            inp = torch.tensor([ids])
            gen = ref.model.generate(input_ids=inp, attention_mask=torch.ones_like(inp),
                                     do_sample=False, max_new_tokens=tokens,
                                     min_new_tokens=tokens, output_logits=True,
                                     return_dict_in_generate=True, pad_token_id=0)
    finally:
        for h in handles:
            h.remove()
    return gen.sequences[0, len(ids):].tolist(), [torch.log_softmax(s[0].float(), -1)
                                                  for s in gen.logits]


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "gemma", "gemma2"])
def test_an_intervened_request_equals_transformers_with_a_hook_and_its_neighbours_are_untouched(
        family):
    """Steering (a vector added to layer 0's resid_post, scaled) and head ablation (head 0's z
    zeroed at the last layer) on one request of three: its tokens and logprobs are
    transformers' with forward hooks doing the same; the other two are bit-identical to a run
    without it."""
    loaded, ref = pristine(family)
    cfg = ref.model.config
    last = cfg.num_hidden_layers - 1
    vector = torch.randn(cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    interventions = [{"site": "resid_post", "layer": 0, "op": "add", "vector": vector.tolist(),
                      "scale": 3.0},
                     {"site": "z", "layer": last, "op": "zero", "heads": [0]}]
    plain = greedy(6)
    outs = make_llm(loaded).generate(PROMPTS, [plain, greedy(6, interventions=interventions),
                                               plain])
    alone = make_llm(dataclasses.replace(ref, model=copy.deepcopy(ref.model))).generate(
        PROMPTS, plain)
    for i in (0, 2):
        assert outs[i].outputs[0].token_ids == alone[i].outputs[0].token_ids
        assert outs[i].outputs[0].logprobs == alone[i].outputs[0].logprobs
    arch = architecture_of(cfg)
    sites, _ = sites_of(arch, cfg)
    layers = module_at(ref.model, arch.layers)
    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    def steer(module, args, out):
        (out[0] if isinstance(out, tuple) else out).add_(3.0 * vector)

    def ablate(module, args):
        z = args[0].clone()
        z[..., :head] = 0
        return (z,)

    tokens, logprobs = _hook_reference(ref, outs[1].prompt_token_ids, [
        (layers[0], False, steer), (module_at(layers[last], sites.z), True, ablate)], 6)
    got = outs[1].outputs[0]
    assert got.token_ids == tokens
    assert got.token_ids != alone[1].outputs[0].token_ids or got.logprobs != alone[1].outputs[
        0].logprobs
    worst = max(abs(lp[t].logprob - ref_lp[t].item())
                for t, lp, ref_lp in zip(got.token_ids, got.logprobs, logprobs))
    assert worst < 1e-5


def test_patching_sets_listed_positions_and_scale_and_zero_apply_where_asked():
    """`set` with one row per listed position patches those rows only (a capture of the same
    site sees the patched values); `zero` on mlp_out of the prompt positions."""
    loaded, _ = pristine()
    width = loaded.model.config.hidden_size
    rows = torch.arange(2 * width, dtype=torch.float32).view(2, width) / width
    out = make_llm(loaded).generate([PROMPTS[0]], greedy(2, capture={
        "sites": ["resid_post", "mlp_out"], "layers": [0]}, interventions=[
        {"site": "blocks.0.hook_resid_post", "op": "set", "vector": rows.tolist(),
         "positions": [1, 3]},
        {"site": "mlp_out", "layer": 0, "op": "zero", "positions": "prompt"}]))[0]
    resid = out.activations["resid_post", 0]
    assert torch.equal(resid[[1, 3]], rows)
    prompt = len(out.prompt_token_ids)
    mlp = out.activations["mlp_out", 0]
    assert torch.count_nonzero(mlp[:prompt]) == 0 and torch.count_nonzero(mlp[prompt:]) > 0


def test_named_steering_vectors_load_at_start_and_apply(tmp_path):
    loaded, ref = pristine()
    width = loaded.model.config.hidden_size
    vector = np.linspace(-2, 2, width, dtype=np.float32)
    np.save(tmp_path / "happy.npy", vector)
    llm = make_llm(loaded, steering_vectors={"happy": str(tmp_path / "happy.npy")})
    by_name, inline = llm.generate([PROMPTS[0]] * 2, [
        greedy(5, interventions=[{"site": "resid_pre", "layer": 1, "op": "add",
                                  "name": "happy"}]),
        greedy(5, interventions=[{"site": "resid_pre", "layer": 1, "op": "add",
                                  "vector": vector.tolist()}])])
    assert by_name.outputs[0].token_ids == inline.outputs[0].token_ids
    assert by_name.outputs[0].logprobs == inline.outputs[0].logprobs
    with pytest.raises(ValidationError) as err:
        llm.generate([PROMPTS[0]], greedy(2, interventions=[
            {"site": "resid_pre", "layer": 1, "op": "add", "name": "sad"}]))
    assert err.value.parameter == "interventions[0].name"
    with pytest.raises(ValidationError):
        make_llm(ref, steering_vectors={"bad": str(tmp_path / "missing.npy")})


@pytest.mark.parametrize("inside, parameter", [
    ({"capture": {"sites": ["blocks.9.hook_resid_post"]}}, "capture.sites"),
    ({"capture": {"sites": ["hook_nonsense"]}}, "capture.sites"),
    ({"capture": ["resid_post"], "n": 2, "temperature": 1.0}, "capture"),
    ({"logit_lens": {"top_k": 0}}, "logit_lens.top_k"),
    ({"capture": {"sites": ["resid_post"], "positions": {"start": 4, "stop": 2}}},
     "capture.positions"),
    ({"logit_lens": {"positions": [-1]}}, "logit_lens.positions"),
    ({"interventions": [{"site": "resid_post", "layer": 0, "op": "add", "vector": [1.0]}]},
     "interventions[0].vector"),
    ({"interventions": [{"site": "resid_post", "layer": 0, "op": "add",
                         "vector": [float("nan")] * 64}]}, "interventions[0].vector"),
    ({"interventions": [{"site": "resid_post", "layer": 0, "op": "explode"}]},
     "interventions[0].op"),
])
def test_what_cannot_be_captured_or_applied_is_refused_naming_the_field(inside, parameter):
    loaded, _ = pristine()
    assert loaded.model.config.hidden_size == 64
    llm = make_llm(loaded)
    with pytest.raises(ValidationError) as err:
        llm.generate([PROMPTS[0]], SamplingParams(max_tokens=2, **inside))
    assert err.value.parameter == parameter
    assert not llm.llm_engine.requests  # nothing left behind


def test_a_site_the_family_does_not_have_is_refused_and_captures_are_bounded():
    loaded, _ = pristine("gpt_neox")  # Pythia's parallel attention and MLP: no resid_mid
    llm = make_llm(loaded, max_capture_mb=0.01)
    with pytest.raises(ValidationError, match="parallel") as err:
        llm.generate([PROMPTS[0]], greedy(2, capture=["resid_mid"]))
    assert err.value.parameter == "capture.sites"
    with pytest.raises(ValidationError, match="max-capture-mb") as err:
        llm.generate([PROMPTS[0]], greedy(200, capture=["resid_post", "pattern"]))
    assert err.value.parameter == "capture"
    out = llm.generate([PROMPTS[0]], greedy(2, capture={"sites": ["resid_post"], "layers": [0],
                                                         "reduce": "mean"}))[0]
    assert out.activations["resid_post", 0].shape == (64,)
    assert not llm.llm_engine.requests  # the recording went with the finished request


def test_bfloat16_captures_are_the_model_dtype_values():
    loaded, ref = pristine(dtype="bfloat16")
    out = make_llm(loaded).generate([PROMPTS[0]], greedy(3, capture=["resid_pre"]))[0]
    states = hidden_states(ref, sequence(out))
    for layer in range(2):
        got, expected = out.activations["resid_pre", layer], states[layer][0].float()
        assert (got - expected).abs().max().item() <= 0.05 * max(1.0, expected.abs().max())


def test_a_finished_request_leaves_no_recording_behind():
    """Memory returns: once the outputs are built, the engine holds no request's recording (the
    cache's tensors belong to the RequestOutput alone)."""
    import gc

    from workbench.engine.requests.recording import Recording

    loaded, _ = pristine()
    llm = make_llm(loaded)
    outs = llm.generate(PROMPTS, [greedy(3, capture={"sites": ["resid_post", "pattern"]}),
                                  greedy(3, logit_lens={"top_k": 2}), greedy(3)])
    assert outs[0].activations is not None and outs[1].logit_lens is not None
    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, Recording)]
    assert not llm.llm_engine.has_unfinished_requests()


def test_recorded_chunks_stack_in_position_order_latest_row_kept():
    """A recording keeps rows as the chunks they came in: joined as they are when they follow
    each other, row by row (the latest of a position kept) when a prefix was recomputed."""
    from workbench.engine.requests.recording import _positions, _stack

    a, b, c = torch.arange(6.).view(3, 2), torch.full((2, 2), 9.), torch.full((1, 2), 7.)
    assert torch.equal(_stack([(0, a), (3, b)]), torch.cat([a, b]))
    assert _positions([(0, a), (3, b)]) == {0, 1, 2, 3, 4}
    assert torch.equal(_stack([(0, a), (1, c)]), torch.stack([a[0], c[0], a[2]]))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_decode_that_captures_and_steers_the_residual_stream_runs_in_c_and_equals_the_loop(
        dtype, monkeypatch):
    """Capture (layer 0's resid_post, the last layer's) and steering (layer 1's resid_pre) only
    touch the residual stream between layers: a step of decodes runs as C calls cut there
    (`DecoderStack._c_segments`), the inspector visiting at each cut. Tokens, logprobs and
    captured rows are the loop's bit for bit, for the steered request and its neighbours."""
    from workbench.engine.kernels import projections
    from workbench.engine.step.decoder import DecoderStack
    from workbench.engine.step.fusion import C_KERNELS

    kernel = projections.choose(getattr(torch, dtype))
    if kernel.ops != "c" or kernel.kernel not in C_KERNELS or (
            dtype == "bfloat16" and projections.emulated(torch.bfloat16)):
        pytest.skip(f"no C decode step for {dtype} here ({kernel.describe()})")
    loaded = tiny_model("llama", dtype=dtype)
    last = loaded.config.num_hidden_layers - 1
    vector = torch.randn(loaded.config.hidden_size, generator=torch.Generator().manual_seed(2))
    inside = {"capture": {"sites": ["resid_post"], "layers": [0, last]},
              "interventions": [{"site": "resid_pre", "layer": 1, "op": "add",
                                 "vector": vector.tolist()}]}
    params = [greedy(6), greedy(6, **inside), greedy(6, capture={"sites": ["resid_post"],
                                                                  "layers": [0]})]

    def run():
        llm = make_llm(dataclasses.replace(loaded, model=copy.deepcopy(loaded.model)))
        return llm.generate(PROMPTS, params)

    cut = []
    segments = DecoderStack._c_segments
    monkeypatch.setattr(DecoderStack, "_c_segments", lambda self, *a: cut.append(a[-1]) or
                        segments(self, *a))
    in_c = run()
    assert [1, last + 1] in cut  # after layer 0 (its resid_post, layer 1's resid_pre), the end
    monkeypatch.setattr(DecoderStack, "_residual_cuts", staticmethod(lambda inspector: None))
    looped = run()
    for a, b in zip(in_c, looped):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].logprobs == b.outputs[0].logprobs
        if a.activations is not None:
            assert a.activations.keys() == b.activations.keys() and a.activations.keys()
            for name, rows in a.activations.items():
                assert torch.equal(rows, b.activations[name]), name
