"""Logprobs and prompt logprobs agree (within 1e-4) with a direct fp32 forward of the HF model.

The reference is `log_softmax` of transformers' own logits over prompt + generated tokens; the
engine's entries list the chosen token first (with its rank), then the top-k by logprob.
"""

import pytest
import torch

from tests.engine.helpers import greedy, make_llm
from workbench.sampling_params import SamplingParams

PROMPT = "You are a helpful assistant. Question: what is the capital of Italy? Answer:"
TOL = 1e-4
K = 5


@torch.inference_mode()
def reference_logprobs(loaded, token_ids: list[int]) -> torch.Tensor:
    """[T, V]: row i is the log-distribution of token i + 1 given tokens 0..i."""
    logits = loaded.model(torch.tensor([token_ids])).logits[0].float()
    return logits.log_softmax(-1)


def check_position(entry: dict, token: int, ref_row: torch.Tensor, k: int, texts) -> None:
    """One position's {token: Logprob}: chosen first, values, ranks and the top-k."""
    ids = list(entry)
    assert ids[0] == token
    chosen = entry[token]
    assert abs(chosen.logprob - ref_row[token].item()) < TOL
    assert chosen.rank == int((ref_row > ref_row[token]).sum()) + 1
    assert chosen.decoded_token == texts(token)
    top = ref_row.topk(k)
    assert set(ids) == {token} | set(top.indices.tolist())
    for rank, (tid, lp) in enumerate(zip(top.indices.tolist(), top.values.tolist()), start=1):
        assert abs(entry[tid].logprob - lp) < TOL
        assert entry[tid].rank == rank


@pytest.fixture(scope="module")
def llm(default_model):
    return make_llm(default_model, block_size=16, num_kv_blocks=32, max_num_batched_tokens=8)


@pytest.fixture(scope="module")
def greedy_run(llm, default_model):
    params = greedy(4, logprobs=K, prompt_logprobs=K)
    out = llm.generate(PROMPT, params)[0]
    full = out.prompt_token_ids + out.outputs[0].token_ids
    return out, reference_logprobs(default_model, full)


def texts_of(tokenizer):
    return lambda t: tokenizer.decode([t])


@pytest.mark.slow
def test_sample_logprobs_match_a_forward_pass(greedy_run, default_model):
    out, ref = greedy_run
    completion = out.outputs[0]
    start = len(out.prompt_token_ids)
    assert len(completion.logprobs) == len(completion.token_ids) == 4
    for j, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        check_position(entry, token, ref[start + j - 1], K, texts_of(default_model.tokenizer))


@pytest.mark.slow
def test_prompt_logprobs_match_a_forward_pass_across_prefill_chunks(greedy_run, default_model):
    out, ref = greedy_run
    prompt = out.prompt_token_ids
    assert len(prompt) > 8  # max_num_batched_tokens=8: the prompt was computed in chunks
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == len(prompt)
    for i in range(1, len(prompt)):
        check_position(out.prompt_logprobs[i], prompt[i], ref[i - 1], K,
                       texts_of(default_model.tokenizer))


@pytest.mark.slow
def test_cumulative_logprob_is_the_sum_of_chosen_logprobs(greedy_run):
    out, ref = greedy_run
    completion = out.outputs[0]
    start = len(out.prompt_token_ids)
    expected = sum(ref[start + j - 1, t].item() for j, t in enumerate(completion.token_ids))
    assert abs(completion.cumulative_logprob - expected) < 4 * TOL


@pytest.mark.slow
def test_greedy_tokens_have_rank_one(greedy_run):
    out, _ = greedy_run
    completion = out.outputs[0]
    assert [e[t].rank for t, e in zip(completion.token_ids, completion.logprobs)] == [1] * 4


def test_a_sampled_token_is_listed_first_even_outside_the_top_k(tiny_llama):
    llm = make_llm(tiny_llama)
    params = SamplingParams(temperature=5.0, seed=3, max_tokens=16, logprobs=1, ignore_eos=True)
    completion = llm.generate("Hello", params)[0].outputs[0]
    ranks = [e[t].rank for t, e in zip(completion.token_ids, completion.logprobs)]
    assert [next(iter(e)) for e in completion.logprobs] == completion.token_ids
    assert any(r > 1 for r in ranks)  # at temperature 5 some draws miss the top token
    assert all(len(e) == (1 if r == 1 else 2) for e, r in zip(completion.logprobs, ranks))


def test_logprobs_zero_returns_only_the_chosen_token(tiny_llama):
    llm = make_llm(tiny_llama)
    out = llm.generate("Hello", greedy(3, logprobs=0, prompt_logprobs=0))[0]
    completion = out.outputs[0]
    assert [list(e) for e in completion.logprobs] == [[t] for t in completion.token_ids]
    assert [list(e) for e in out.prompt_logprobs[1:]] == [[t] for t in out.prompt_token_ids[1:]]


def test_no_logprobs_requested_means_none(tiny_llama):
    llm = make_llm(tiny_llama)
    out = llm.generate("Hello", greedy(3))[0]
    assert out.outputs[0].logprobs is None and out.prompt_logprobs is None
    assert out.outputs[0].cumulative_logprob is None


def test_logprobs_of_a_request_do_not_depend_on_its_batch(tiny_llama):
    llm = make_llm(tiny_llama)
    params = greedy(4, logprobs=3)
    alone = llm.generate("The quick brown fox", params)[0].outputs[0]
    batch = llm.generate(["Once upon a time", "The quick brown fox", "1 2 3"],
                         [greedy(4), params, SamplingParams(temperature=1.0, seed=1, max_tokens=4)])
    together = batch[1].outputs[0]
    assert together.token_ids == alone.token_ids
    for a, b in zip(alone.logprobs, together.logprobs):
        assert list(a) == list(b)
        assert all(abs(a[t].logprob - b[t].logprob) < TOL for t in a)


def test_logprobs_do_not_depend_on_prefill_chunking(tiny_qwen2):
    prompts = ["Hello there my friend", "The quick brown fox jumps"]
    params = greedy(6, logprobs=2, prompt_logprobs=2)
    whole = make_llm(tiny_qwen2).generate(prompts, params)
    # one token per step: every prompt token goes through the single-token (decode) path
    split = make_llm(tiny_qwen2, block_size=2, num_kv_blocks=256,
                     max_num_batched_tokens=1).generate(prompts, params)
    for w, s in zip(whole, split):
        assert s.outputs[0].token_ids == w.outputs[0].token_ids
        pairs = list(zip(w.prompt_logprobs[1:] + w.outputs[0].logprobs,
                         s.prompt_logprobs[1:] + s.outputs[0].logprobs))
        assert len(pairs) == len(w.prompt_token_ids) - 1 + 6
        for a, b in pairs:
            assert list(a) == list(b)
            assert all(abs(a[t].logprob - b[t].logprob) < TOL for t in a)
