"""Preemption by recompute end to end: a KV cache far too small for the batch changes nothing.

A tiny llama with 16 blocks of 4 slots (64 tokens, the minimum for max_model_len=64) serves
prompts that together need several times that; sequences are preempted, recomputed, and must
still give the same tokens as an engine with room for everything.
"""

import pytest

from tests.engine.helpers import alone_and_preempted_mid_prefill, greedy, make_llm
from workbench.sampling_params import SamplingParams

PROMPTS = ["Once upon a time", "The weather today is", "Hello, my name is", "1 2 3 4"]
NEW = 30


def run(loaded, prompts, params, **kwargs):
    llm = make_llm(loaded, max_model_len=64, block_size=4, **kwargs)
    outputs = llm.generate(prompts, params)
    return llm, [[c.token_ids for c in o.outputs] for o in outputs]


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_greedy_output_is_unchanged_by_preemption(tiny_llama, prefix_caching):
    params = greedy(NEW, ignore_eos=True)
    _, roomy = run(tiny_llama, PROMPTS, params, num_kv_blocks=256)
    llm, tight = run(tiny_llama, PROMPTS, params, num_kv_blocks=16,
                     enable_prefix_caching=prefix_caching)
    assert llm.llm_engine.stats().num_preemptions > 0
    assert tight == roomy


def test_seeded_samples_are_unchanged_by_preemption(tiny_llama):
    params = [SamplingParams(temperature=1.0, seed=i, n=2, max_tokens=NEW, ignore_eos=True)
              for i in range(len(PROMPTS))]
    _, roomy = run(tiny_llama, PROMPTS, params, num_kv_blocks=256)
    llm, tight = run(tiny_llama, PROMPTS, params, num_kv_blocks=16)
    assert llm.llm_engine.stats().num_preemptions > 0
    assert tight == roomy


def test_every_block_is_free_after_a_preempting_run(tiny_llama):
    llm, _ = run(tiny_llama, PROMPTS, greedy(NEW, ignore_eos=True), num_kv_blocks=16)
    bm = llm.llm_engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks == 16
    assert all(b.ref_count == 0 for b in bm.blocks)



def test_prompt_logprobs_survive_preemption_in_the_middle_of_a_chunked_prefill(tiny_llama):
    prompt = list(range(1000, 1030))
    alone, preempted, preemptions = alone_and_preempted_mid_prefill(
        tiny_llama, prompt, greedy(2, prompt_logprobs=1))
    got, want = preempted.prompt_logprobs, alone.prompt_logprobs
    assert preemptions > 0
    assert len(got) == len(want) == len(prompt) and got[0] is None
    for g, w in zip(got[1:], want[1:]):
        assert list(g) == list(w)
        assert all(abs(g[t].logprob - w[t].logprob) < 1e-4 for t in g)
