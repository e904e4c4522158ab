"""Greedy decoding is token-identical to transformers' `generate(do_sample=False)` in fp32.

On the real SmolLM2-135M (few new tokens: the numbers are the point) and on tiny qwen2 and
mistral models: alone, batched in one `generate` call, with prefix-cache hits, and with
prefill chunked by a small `max_num_batched_tokens`.
"""

import pytest

from tests.engine.helpers import greedy, hf_greedy, ids_of, make_llm

NEW = 16
SYSTEM = "You are a helpful assistant. Answer briefly, precisely and politely, in English. "
PROMPTS = [
    "The capital of France is",
    SYSTEM + "Question: what is two plus two?",
    SYSTEM + "Question: name a primary colour.",
    "def fibonacci(n):\n    ",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
]
BLOCK = 8  # small blocks: the shared system prompt spans several full ones


@pytest.fixture(scope="module")
def real_refs(default_model):
    ids = [ids_of(default_model, p) for p in PROMPTS]
    return ids, [hf_greedy(default_model, i, NEW) for i in ids]


def real_llm(default_model, **kwargs):
    return make_llm(default_model, block_size=BLOCK, num_kv_blocks=64, **kwargs)


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.slow
def test_real_model_alone_matches_transformers(default_model, real_refs):
    ids, refs = real_refs
    llm = real_llm(default_model, enable_prefix_caching=False)
    got = [token_ids(llm.generate({"prompt_token_ids": i}, greedy(NEW)))[0] for i in ids]
    assert got == refs


@pytest.mark.slow
def test_real_model_batched_matches_transformers(default_model, real_refs):
    ids, refs = real_refs
    llm = real_llm(default_model, enable_prefix_caching=False)
    outputs = llm.generate(PROMPTS, greedy(NEW))
    assert [o.prompt_token_ids for o in outputs] == ids
    assert token_ids(outputs) == refs


@pytest.mark.slow
def test_real_model_same_prompt_twice_hits_the_prefix_cache(default_model, real_refs):
    ids, refs = real_refs
    llm = real_llm(default_model)
    first = llm.generate(PROMPTS[1], greedy(NEW))[0]
    second = llm.generate(PROMPTS[1], greedy(NEW))[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens > 0
    assert second.num_cached_tokens % BLOCK == 0
    assert token_ids([first, second]) == [refs[1], refs[1]]


@pytest.mark.slow
def test_real_model_shared_prefix_hit_with_chunked_prefill(default_model, real_refs):
    ids, refs = real_refs
    llm = real_llm(default_model, max_num_batched_tokens=8)  # every prompt is split
    assert all(len(i) > 8 for i in ids[1:3])
    first = llm.generate(PROMPTS[1], greedy(NEW))[0]
    second = llm.generate(PROMPTS[2], greedy(NEW))[0]
    assert second.num_cached_tokens >= 2 * BLOCK
    assert token_ids([first, second]) == refs[1:3]


@pytest.mark.slow
def test_real_model_batch_mixing_cache_hits_and_fresh_prompts(default_model, real_refs):
    ids, refs = real_refs
    llm = real_llm(default_model)
    llm.generate(PROMPTS[1], greedy(2))
    outputs = llm.generate(PROMPTS[2:] + PROMPTS[:2], greedy(NEW))
    assert [o.num_cached_tokens > 0 for o in outputs] == [True, False, False, False, True]
    assert token_ids(outputs) == refs[2:] + refs[:2]


@pytest.mark.slow
def test_real_model_batched_with_chunked_prefill_matches_transformers(default_model, real_refs):
    ids, refs = real_refs
    llm = real_llm(default_model, max_num_batched_tokens=8, enable_prefix_caching=False)
    assert token_ids(llm.generate(PROMPTS, greedy(NEW))) == refs


TINY_PROMPTS = [
    "Hello, my name is",
    "The quick brown fox jumps over the lazy dog because it wanted to",
    "1, 2, 3, 4,",
]
TINY_NEW = 16


@pytest.fixture(scope="module", params=["tiny_qwen2", "tiny_mistral", "tiny_llama"])
def tiny(request):
    loaded = request.getfixturevalue(request.param)
    refs = [hf_greedy(loaded, ids_of(loaded, p), TINY_NEW) for p in TINY_PROMPTS]
    return loaded, refs


def test_tiny_model_alone_matches_its_own_generate(tiny):
    loaded, refs = tiny
    llm = make_llm(loaded, block_size=4)
    assert [token_ids(llm.generate(p, greedy(TINY_NEW)))[0] for p in TINY_PROMPTS] == refs


def test_tiny_model_batched_matches_its_own_generate(tiny):
    loaded, refs = tiny
    llm = make_llm(loaded, block_size=4)
    assert token_ids(llm.generate(TINY_PROMPTS, greedy(TINY_NEW))) == refs


def test_tiny_model_chunked_prefill_matches_its_own_generate(tiny):
    loaded, refs = tiny
    llm = make_llm(loaded, block_size=4, max_num_batched_tokens=5)
    assert token_ids(llm.generate(TINY_PROMPTS, greedy(TINY_NEW))) == refs


def test_tiny_model_prefix_cache_hits_keep_the_output(tiny):
    loaded, refs = tiny
    llm = make_llm(loaded, block_size=4)
    llm.generate(TINY_PROMPTS, greedy(TINY_NEW))
    again = llm.generate(TINY_PROMPTS, greedy(TINY_NEW))
    assert again[1].num_cached_tokens > 0
    assert token_ids(again) == refs


@pytest.mark.parametrize("penalty", [1.3, 0.8])
def test_tiny_model_repetition_penalty_matches_transformers(tiny, penalty):
    loaded, _ = tiny
    llm = make_llm(loaded, block_size=4)
    ids = ids_of(loaded, "The weather today is")
    want = hf_greedy(loaded, ids, TINY_NEW, repetition_penalty=penalty)
    got = llm.generate(ids, greedy(TINY_NEW, repetition_penalty=penalty))[0].outputs[0].token_ids
    assert got == want


def test_tiny_model_cache_hit_leaving_a_single_prompt_token(tiny):
    loaded, _ = tiny
    ids = list(range(2000, 2009))  # 9 tokens, blocks of 4: 8 cached, 1 left to compute
    want = hf_greedy(loaded, ids, TINY_NEW)
    llm = make_llm(loaded, block_size=4)
    llm.generate(ids, greedy(1))
    again = llm.generate(ids, greedy(TINY_NEW))[0]
    assert again.num_cached_tokens == 8
    assert again.outputs[0].token_ids == want
