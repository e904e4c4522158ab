"""Every decoder family of `workbench/models/architectures.py`, exact against transformers.

Each family is a tiny random model (`tiny_model(family)`) with what makes it itself: partial
rotary (phi, stablelm, gpt_neox, gptj), parallel attention + MLP (phi, gpt_neox, gptj, cohere),
learned absolute positions (gpt2, opt), QK norms (qwen3, olmo2, gemma3_text), attention and
final soft-capping with local / global layers (gemma2), per-layer rope bases (gemma3_text),
scaled logits (granite, cohere), experts (mixtral, qwen2_moe), biases (qwen2, gpt2, starcoder2,
phi), ALiBi (bloom, falcon's variant), multi-query and grouped fused heads (falcon), tied and
untied heads. Greedy tokens must equal transformers' `generate` on an untouched
copy of the same weights and logprobs lie within 1e-5, for prompts batched together, then
again across chunked prefill, prefix-cache hits and preemption; sliding windows on prompts
several times longer than the window. Families the engine cannot run exactly are refused.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from tests.engine.helpers import make_llm
from workbench.models.architectures import ARCHITECTURES, UnsupportedModelError, architecture_of
from workbench.models.tiny import tiny_model
from workbench.sampling_params import SamplingParams

FAMILIES = sorted(ARCHITECTURES)
PROMPTS = ["Once upon a time there was", "The capital of France is",
           "1 2 3 4 5 6 7 8 9 10 11 12 13 14"]
LONG = ["one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen twenty",
        "The capital of France is a city with a long history, and many people visit it every "
        "year to see", "hi"]
LOGPROB_TOLERANCE = 1e-5


@torch.inference_mode()
def reference(loaded, prompts: list[str], max_new_tokens: int):
    """transformers' greedy tokens and per-step logprobs, one unpadded prompt at a time, on a
    copy of the model made before any engine touched it."""
    model = loaded.model
    out = []
    for prompt in prompts:
        ids = torch.tensor([loaded.tokenizer(prompt)["input_ids"]])
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             pad_token_id=loaded.tokenizer.pad_token_id, output_logits=True,
                             return_dict_in_generate=True)  # raw logits: no EOS suppression
        tokens = gen.sequences[0, ids.shape[1]:].tolist()
        out.append((tokens, [torch.log_softmax(s[0].float(), -1) for s in gen.logits]))
    return out


def pristine(family: str, **overrides):
    """(a tiny model for the engine, an untouched copy of it for transformers)."""
    loaded = tiny_model(family, **overrides)
    return loaded, dataclasses.replace(loaded, model=copy.deepcopy(loaded.model))


def assert_exact(outputs, expected) -> None:
    for out, (tokens, logprobs) in zip(outputs, expected):
        got = out.outputs[0]
        assert got.finish_reason == "length"
        assert got.token_ids == tokens
        worst = max(abs(lp[t].logprob - ref[t].item())
                    for t, lp, ref in zip(got.token_ids, got.logprobs, logprobs))
        assert worst < LOGPROB_TOLERANCE


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, logprobs=1, ignore_eos=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_is_token_identical_to_transformers(family):
    loaded, ref = pristine(family)
    expected = reference(ref, PROMPTS, 12)
    assert_exact(make_llm(loaded).generate(PROMPTS, greedy(12)), expected)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox", "gemma2", "phi", "opt",
                                    "qwen2_moe", "bloom", "falcon"])
def test_family_exact_across_chunks_prefix_hits_and_preemption(family):
    """Prefill in chunks of 5 tokens, a second round whose prompts hit the prefix cache, and a
    KV cache too small for all three at once (preemption and recompute)."""
    loaded, ref = pristine(family)
    expected = reference(ref, PROMPTS, 16)
    llm = make_llm(loaded, block_size=4, num_kv_blocks=64, max_model_len=256,
                   max_num_batched_tokens=5, enable_chunked_prefill=True)
    assert_exact(llm.generate(PROMPTS, greedy(16)), expected)
    assert_exact(llm.generate(PROMPTS, greedy(16)), expected)  # cached prefixes
    assert llm.llm_engine.block_manager.prefix_hits > 0
    tight = make_llm(loaded, block_size=4, num_kv_blocks=14, max_model_len=48)
    assert_exact(tight.generate(PROMPTS, greedy(16)), expected)
    assert tight.llm_engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("family, overrides", [
    ("mistral", dict(sliding_window=8)),  # every layer
    ("qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    ("gemma2", {}),  # local (8) and global layers, interleaved
    ("gemma3_text", {}),
    ("phi3", dict(sliding_window=8)),
    ("starcoder2", dict(sliding_window=8)),
])
def test_sliding_windows_on_prompts_longer_than_the_window(family, overrides):
    loaded, ref = pristine(family, **overrides)
    expected = reference(ref, LONG, 24)
    llm = make_llm(loaded, block_size=4, max_num_batched_tokens=7, enable_chunked_prefill=True)
    assert llm.llm_engine.max_model_len == 256  # the window does not cut the context
    assert_exact(llm.generate(LONG, greedy(24)), expected)


@pytest.mark.parametrize("family, overrides", [("mistral", dict(sliding_window=8)),
                                              ("gemma2", {}), ("bloom", {})])
def test_windowed_soft_capped_and_alibi_decodes_read_their_slots_in_c(family, overrides,
                                                                     monkeypatch):
    """Where the ops are C, decodes under a window (Mistral's), soft-capping and local layers
    (Gemma 2's) or ALiBi (BLOOM's) are attended in C through their cache slots, never a
    gathered copy of their contexts through torch's ops; still transformers' tokens."""
    from workbench.engine.step import attention

    loaded, ref = pristine(family, **overrides)
    expected = reference(ref, LONG, 12)
    llm = make_llm(loaded, block_size=4)
    if llm.llm_engine.runner.kernel.ops != "c":
        pytest.skip(f"no C ops here ({llm.llm_engine.runner.kernel})")

    def gathered(*args, **kwargs):
        raise AssertionError("a decode gathered its context")

    monkeypatch.setattr(attention, "_attend_decodes_masked", gathered)
    assert_exact(llm.generate(LONG, greedy(12)), expected)


def test_blocks_out_of_every_window_are_released():
    """Mistral's window holds every layer to the last 8 positions: a 60-token request keeps
    about 8 + a block of tokens' KV, not 60, with the same tokens as transformers."""
    loaded, ref = pristine("mistral", sliding_window=8)
    prompt = " ".join(["word"] * 40)
    expected = reference(ref, [prompt], 20)
    llm = make_llm(loaded, block_size=4, num_kv_blocks=64)
    engine = llm.llm_engine
    assert engine.scheduler.window == 8
    held = []
    real = engine.runner.execute

    def spy(out):
        held.append(engine.block_manager.num_blocks - engine.block_manager.num_free_blocks)
        return real(out)

    engine.runner.execute = spy
    assert_exact(llm.generate([prompt], greedy(20)), expected)
    assert engine.scheduler.released_blocks >= 10
    assert max(held[1:]) <= 8 // 4 + 2  # the window's blocks and the one being written


def test_a_family_with_llamas_modules_but_other_arithmetic_keeps_its_layers():
    """Granite has Llama's modules but scales embeddings and residuals: the probe step finds
    the lean loop's result different and keeps transformers' layers (exact, as above)."""
    assert make_llm(tiny_model("granite")).llm_engine.runner.stack is None
    assert make_llm(tiny_model("llama")).llm_engine.runner.stack is not None


@pytest.mark.parametrize("overrides", [
    dict(alibi=True),  # falcon-rw's ALiBi
    dict(new_decoder_architecture=True, num_kv_heads=2),  # falcon-40b's grouped heads
    dict(multi_query=False, parallel_attn=False),
    dict(alibi=True, multi_query=False),
])
def test_falcons_variants_are_token_identical(overrides):
    """Falcon computes attention in its own module: the engine's stand-in for its forward
    (`engine/step/attention_modules.py`) on each layout of its fused heads, rotary or ALiBi."""
    loaded, ref = pristine("falcon", **overrides)
    expected = reference(ref, PROMPTS, 12)
    assert_exact(make_llm(loaded).generate(PROMPTS, greedy(12)), expected)


def test_a_model_the_engine_cannot_run_exactly_is_refused_at_load_naming_it():
    with pytest.raises(UnsupportedModelError, match="model_type 'bloom'.*slow_but_exact.*"
                                                    "Supported model types: .*gpt2"):
        make_llm(tiny_model("bloom", pretraining_tp=2, slow_but_exact=True))


def test_an_unknown_family_and_a_length_dependent_rope_are_refused_by_name():
    config = copy.deepcopy(tiny_model("llama").config)
    config.model_type = "not-llama"
    with pytest.raises(UnsupportedModelError, match="'not-llama'.*not one the engine knows"):
        architecture_of(config)
    config.model_type = "llama"
    config.rope_parameters = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    with pytest.raises(UnsupportedModelError, match="rope scaling 'dynamic'"):
        architecture_of(config)


def test_bfloat16_stays_close_to_transformers():
    """bfloat16: the first step's logprobs within 0.05 of transformers' own bf16 forward (the
    engine's fused projections round differently), for a family of each layout."""
    for family in ("llama", "gpt2", "gpt_neox", "gemma2"):
        loaded, ref = pristine(family, dtype="bfloat16")
        ids = ref.tokenizer(PROMPTS[0])["input_ids"]
        with torch.inference_mode():
            want = torch.log_softmax(ref.model(torch.tensor([ids])).logits[0, -1].float(), -1)
        got = make_llm(loaded).generate(PROMPTS[:1], SamplingParams(
            temperature=0, max_tokens=1, logprobs=5))[0].outputs[0].logprobs[0]
        assert max(abs(lp.logprob - want[t].item()) for t, lp in got.items()) < 0.05, family


def test_a_refused_family_is_refused_before_its_weights_load(tmp_path):
    """`load_model` reads the config first: a directory with only the config.json of a family
    the engine does not know (GPT-Neo) is refused by name (no weights are there to load)."""
    from transformers import AutoConfig

    from workbench.models import load_model

    AutoConfig.for_model("gpt_neo").save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="'gpt_neo'"):
        load_model(tmp_path, progress=False)


def test_lora_on_a_family_without_the_adapters_projections_is_refused():
    """GPT-2's projections are `c_attn` / `c_proj` Conv1Ds: an adapter would change nothing."""
    from workbench.errors import ValidationError

    with pytest.raises(ValidationError, match="model_type 'gpt2' names its projections"):
        make_llm(tiny_model("gpt2"), enable_lora=True)
    assert make_llm(tiny_model("qwen3"), enable_lora=True).llm_engine.lora.modules


def test_a_layer_that_does_not_call_the_attention_interface_is_refused_at_load():
    """The probe step counts the layers that reached the paged attention: one that computes
    attention its own way would run without the KV cache, so the model is refused."""
    loaded = tiny_model("llama")
    attn = loaded.model.model.layers[1].self_attn
    attn.forward = lambda hidden_states, *args, **kwargs: (torch.zeros_like(hidden_states), None)
    with pytest.raises(UnsupportedModelError, match="1 of its layers do not call transformers' "
                                                    "attention interface"):
        make_llm(loaded)
