"""The lean decoder loop (engine/step/decoder.py) computes exactly what transformers' layers do."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from tests.engine.helpers import make_llm
from workbench.models import tiny_model
from workbench.sampling_params import SamplingParams

PROMPTS = ["The quick brown fox jumps over the lazy dog because",
           "The quick brown fox jumps over the lazy dog and then",  # shares a cached prefix
           "Hello", "Once upon a time, in a land far away, there lived a very small knight"]


def _pair(arch: str, dtype: str):
    """Two engines on copies of one tiny model: one with the lean loop, one without."""
    base = tiny_model(arch, dtype=dtype)
    llms = []
    for lean in (True, False):
        loaded = dataclasses.replace(base, model=copy.deepcopy(base.model))
        llm = make_llm(loaded, max_num_batched_tokens=24, enable_prefix_caching=True)
        runner = llm.llm_engine.runner
        assert runner.stack is not None  # a supported family, in any dtype
        runner.stack.c_ops = False  # torch's ops: the C norms differ in the last bit
        if not lean:
            runner.stack = None  # transformers' decoder layers, called one by one
        llms.append(llm)
    return llms


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gemma", "gemma2"])
def test_lean_loop_is_bit_identical_to_the_layers(arch, dtype):
    """Chunked prefill, a prefix-cache hit, mixed prefill and decode steps, n > 1 forks: every
    token and every logprob (sampled, top-3 and prompt) is the same bit for bit."""
    params = [SamplingParams(max_tokens=12, temperature=0, logprobs=3, prompt_logprobs=2,
                             ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=1.0, n=2, seed=7, logprobs=3,
                             ignore_eos=True)]
    results = []
    for llm in _pair(arch, dtype):
        outs = llm.generate(PROMPTS[:1], params[0])  # caches the shared prefix first
        outs += llm.generate(PROMPTS, [params[i % 2] for i in range(len(PROMPTS))])
        results.append([(list(c.token_ids), c.logprobs, o.prompt_logprobs)
                        for o in outs for c in o.outputs])
    lean, layers = results
    assert lean == layers




@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gemma2s_sandwich_layers_capture_and_steer_as_the_layers_do(dtype):
    """Gemma 2's layers in the loop (each branch between two norms of its own): every hook
    point captured, and steering where its hook points sit between those norms (attn_out,
    resid_mid, mlp_out) and a head ablated, the same bits as transformers' layers under the engine's hooks."""
    sites = ["resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post", "pattern"]
    results = []
    for llm in _pair("gemma2", dtype):
        width = llm.llm_engine.model.config.hidden_size
        steer = [{"site": site, "layer": 1, "op": "add", "vector": [0.25] * width, "scale": 2.0,
                  "positions": "all"} for site in ("attn_out", "resid_mid", "mlp_out")]
        steer.append({"site": "z", "layer": 0, "op": "zero", "heads": [0]})
        params = [SamplingParams(max_tokens=6, temperature=0, logprobs=2, ignore_eos=True,
                                 capture={"sites": sites}, interventions=steer),
                  SamplingParams(max_tokens=6, temperature=0, logprobs=2, ignore_eos=True,
                                 capture={"sites": sites})]
        outs = llm.generate(PROMPTS[2:], params)
        results.append([(list(o.outputs[0].token_ids), o.outputs[0].logprobs,
                         {name: value.clone() for name, value in o.activations.items()})
                        for o in outs])
    lean, layers = results
    assert lean[0][0] != lean[1][0] or lean[0][1] != lean[1][1]  # the steering changed it
    for (tokens, logprobs, acts), (tokens_ref, logprobs_ref, acts_ref) in zip(lean, layers):
        assert (tokens, logprobs) == (tokens_ref, logprobs_ref)
        assert acts.keys() == acts_ref.keys() and len(acts) >= len(sites)
        for name, value in acts.items():
            assert torch.equal(value, acts_ref[name]), name
