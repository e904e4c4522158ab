"""The engine on a CUDA device (skipped without one): what the CPU tests check, there.

Tiny random models on the GPU: float32 greedy tokens identical to transformers' `generate`
there (batched, prefilled in chunks, off the prefix cache, preempted and recomputed), bfloat16
within its noise, seeded sampling reproducible with every sampling feature on the device, LoRA
rows of a mixed batch equal to transformers + peft, structured outputs that follow their grammar,
beam search equal to the reference search over transformers' forward. `make gpu-check` runs
them (scripts/gpu_check.py); `WORKBENCH_GPU_TESTS_ON_CPU=1` runs them on the CPU instead, its
dry run on a machine without a GPU (`GPU_TEST_DEVICE`).
"""

import copy
import dataclasses
import json
import re

import pytest
import torch

from tests.engine.helpers import (
    GPU_TEST_DEVICE,
    alone_and_preempted_mid_prefill,
    greedy,
    hf_greedy,
    ids_of,
    make_llm,
    rank,
    reference_pool,
)
from tests.lora.helpers import make_adapter, peft_greedy
from workbench.lora.request import LoRARequest
from workbench.models import tiny_model
from workbench.sampling_params import BeamSearchParams, SamplingParams

pytestmark = pytest.mark.gpu

DEVICE = GPU_TEST_DEVICE
PROMPTS = ["Hello, my name is", "The quick brown fox jumps over the lazy dog because",
           "1, 2, 3, 4,"]
NEW = 12
SCHEMA_KEYS = {"colour", "count", "ok"}
SCHEMA = {"type": "object", "additionalProperties": False, "required": sorted(SCHEMA_KEYS),
          "properties": {"colour": {"enum": ["red", "green", "blue"]},
                         "count": {"type": "integer", "minimum": 0, "maximum": 9},
                         "ok": {"type": "boolean"}}}


@pytest.fixture(scope="module")
def llama():
    """(the tiny llama in float32 on the device, an untouched copy of it for transformers,
    transformers' greedy tokens for PROMPTS on that copy)."""
    loaded = tiny_model("llama", seed=0, dtype="float32", device=DEVICE)
    ref = dataclasses.replace(loaded, model=copy.deepcopy(loaded.model))
    return loaded, ref, [hf_greedy(ref, ids_of(ref, p), NEW) for p in PROMPTS]


def token_ids(outputs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


def test_greedy_batch_matches_generate(llama):
    loaded, _, refs = llama
    llm = make_llm(loaded, block_size=4)
    assert llm.llm_engine.runner.device.type == torch.device(DEVICE).type
    assert token_ids(llm.generate(PROMPTS, greedy(NEW))) == refs


def test_chunked_prefill_matches_generate(llama):
    loaded, ref, refs = llama
    assert max(len(ids_of(ref, p)) for p in PROMPTS) > 5  # prompts span several chunks
    llm = make_llm(loaded, block_size=4, max_num_batched_tokens=5)
    assert token_ids(llm.generate(PROMPTS, greedy(NEW))) == refs


def test_prefix_cache_hits_keep_the_output(llama):
    loaded, _, refs = llama
    llm = make_llm(loaded, block_size=4)
    first = llm.generate(PROMPTS, greedy(NEW))
    again = llm.generate(PROMPTS, greedy(NEW))
    assert [o.num_cached_tokens for o in first] == [0, 0, 0]
    assert again[1].num_cached_tokens > 0
    assert token_ids(first) == token_ids(again) == refs


def test_preemption_keeps_the_output(llama):
    loaded, _, _ = llama
    params = greedy(30, ignore_eos=True)
    roomy = make_llm(loaded, max_model_len=64, block_size=4, num_kv_blocks=256)
    tight = make_llm(loaded, max_model_len=64, block_size=4, num_kv_blocks=16)
    want = token_ids(roomy.generate(PROMPTS + PROMPTS[:1], params))
    assert token_ids(tight.generate(PROMPTS + PROMPTS[:1], params)) == want
    assert tight.llm_engine.stats().num_preemptions > 0


def test_preemption_mid_chunked_prefill_keeps_the_prompt_logprobs(llama):
    loaded, _, _ = llama
    prompt = list(range(1000, 1030))
    alone, preempted, preemptions = alone_and_preempted_mid_prefill(
        loaded, prompt, greedy(2, prompt_logprobs=1))
    assert preemptions > 0
    assert preempted.outputs[0].token_ids == alone.outputs[0].token_ids
    for got, want in zip(preempted.prompt_logprobs[1:], alone.prompt_logprobs[1:]):
        assert list(got) == list(want)
        assert all(abs(got[t].logprob - want[t].logprob) < 1e-4 for t in got)


def test_sampling_features_are_reproducible(llama):
    loaded, _, _ = llama
    llm = make_llm(loaded, block_size=4)
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.01, seed=3, n=2,
                            max_tokens=8, logprobs=3, prompt_logprobs=2, repetition_penalty=1.2,
                            presence_penalty=0.5, logit_bias={5: 1.0}, ignore_eos=True)
    first, again = (llm.generate(PROMPTS, params) for _ in range(2))
    assert [[c.token_ids for c in o.outputs] for o in first] == \
           [[c.token_ids for c in o.outputs] for o in again]
    assert all(len(c.logprobs) == 8 for o in first for c in o.outputs)
    assert all(len(o.prompt_logprobs) == len(o.prompt_token_ids) for o in first)


def test_bf16_fused_path_stays_close_to_transformers():
    """bfloat16: fused projections and the lean decoder loop (kernel "torch", i.e. cuBLAS, the
    one CUDA takes) keep logits within bf16 noise of transformers' own model, and the engine
    runs."""
    from workbench.engine.step.fusion import fuse_projections

    lm = tiny_model("llama", seed=0, dtype="bfloat16", device=DEVICE)
    fused = copy.deepcopy(lm.model)
    fuse_projections(fused)
    ids = lm.tokenizer("The quick brown fox jumps", return_tensors="pt").input_ids.to(DEVICE)
    with torch.inference_mode():
        torch.testing.assert_close(fused(ids).logits.float(), lm.model(ids).logits.float(),
                                   rtol=0.02, atol=0.02)
    # the CPU dry run names the kernel CUDA chooses by itself
    llm = make_llm(lm, block_size=4, **({"kernel": "torch"} if DEVICE == "cpu" else {}))
    runner = llm.llm_engine.runner
    assert runner.kernel.kernel == "torch" and runner.stack is not None
    outs = llm.generate(PROMPTS, greedy(8, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two random peft adapters of the tiny llama: `a` (q, v; rank 4), `b` (every projection;
    rank 8)."""
    root = tmp_path_factory.mktemp("gpu-loras")
    return {"a": make_adapter(root / "a", seed=1),
            "b": make_adapter(root / "b", seed=2, rank=8, targets=(
                "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))}


def test_lora_rows_of_a_mixed_batch_equal_transformers_plus_peft(adapters):
    tokenizer = tiny_model("llama").tokenizer
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    refs = {name: peft_greedy(tiny_model("llama", device=DEVICE).model, tokenizer,
                              adapters.get(name), prompts, 8) for name in (None, "a", "b")}
    assert refs["a"] != refs[None] and refs["b"] != refs[None]
    llm = make_llm(tiny_model("llama", device=DEVICE), enable_lora=True, max_loras=2)
    loras = [None, LoRARequest("a", 1, str(adapters["a"])),
             LoRARequest("b", 2, str(adapters["b"]))] * 2
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompts * 2],
                        greedy(8, ignore_eos=True), lora_request=loras)
    assert token_ids(outs) == [refs[None if lora is None else lora.lora_name][i % 3]
                               for i, lora in enumerate(loras)]


def test_structured_outputs_follow_their_grammar(llama):
    loaded, _, _ = llama
    llm = make_llm(loaded)
    regex = SamplingParams(n=2, temperature=1.0, seed=0, max_tokens=20, logprobs=2,
                           structured_outputs={"regex": r"[a-c]{2}-[0-9]{3}"})
    schema = SamplingParams(temperature=1.0, seed=1, max_tokens=60, structured_outputs={
        "json": SCHEMA, "disable_any_whitespace": True})
    outs = llm.generate(PROMPTS, [regex, schema, greedy(6, ignore_eos=True)])
    assert all(re.fullmatch(r"[a-c]{2}-[0-9]{3}", c.text) for c in outs[0].outputs)
    assert all(c.grammar_steps[0].num_allowed > 1 and c.grammar_steps[-1].forced
               for c in outs[0].outputs)
    answer = json.loads(outs[1].outputs[0].text)
    assert set(answer) == SCHEMA_KEYS and answer["colour"] in ("red", "green", "blue")
    assert answer["count"] in range(10) and isinstance(answer["ok"], bool)
    assert len(outs[2].outputs[0].token_ids) == 6


@pytest.mark.parametrize("width", [2, 4])
def test_beam_search_matches_the_reference_search(llama, width):
    loaded, ref, _ = llama
    eos = ref.tokenizer.eos_token_id
    prompt = ids_of(ref, "Once upon a time there was")
    expected = rank(reference_pool(ref, prompt, width, 6, ignore_eos=False), width, 1.0, eos)
    out = make_llm(loaded).beam_search([prompt], BeamSearchParams(beam_width=width,
                                                                  max_tokens=6))[0]
    assert [s.tokens for s in out.sequences] == [e[0] for e in expected]
    assert [s.finish_reason for s in out.sequences] == [e[2] for e in expected]
    assert [s.cum_logprob for s in out.sequences] == pytest.approx([e[1] for e in expected],
                                                                   abs=2e-3)
