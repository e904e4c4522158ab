"""`token_stats`: entropy, rank, top-2 margin and top-k mass of the whole distribution at each
position, against a softmax of transformers' own logits on the tiny llama; the same numbers
whatever `logprobs` k is; prompt positions, the same bits as when generated; a request without
it unchanged."""

import pytest
import torch

from tests.engine.helpers import greedy, make_llm, needs_c
from workbench.errors import ValidationError
from workbench.models import tiny_model
from workbench.sampling_params import SamplingParams

PROMPT = "The quick brown fox jumps over the lazy dog because"
TOL = 1e-4


@torch.inference_mode()
def reference(loaded, token_ids: list[int]) -> torch.Tensor:
    """[T, V]: row i is the log-distribution of token i + 1 given tokens 0..i."""
    return loaded.model(torch.tensor([token_ids])).logits[0].double().log_softmax(-1)


def expected(row: torch.Tensor, token: int, k: int) -> dict:
    probs = row.exp()
    top = row.topk(max(k, 2)).values
    return {"entropy": float(-(probs * row).sum()), "rank": int((row > row[token]).sum()) + 1,
            "margin": float(top[0] - top[1]),
            "top_k_mass": float(top[:k].exp().sum()) if k else 0.0}


def check(stats, want: dict) -> None:
    assert stats.rank == want["rank"]
    for name in ("entropy", "margin", "top_k_mass"):
        assert getattr(stats, name) == pytest.approx(want[name], abs=TOL), name


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return make_llm(tiny_llama)


def test_generated_positions_match_a_softmax_of_transformers_logits(llm, tiny_llama):
    k = 3
    out = llm.generate(PROMPT, greedy(5, logprobs=k, token_stats=True))[0]
    completion = out.outputs[0]
    full = out.prompt_token_ids + completion.token_ids
    ref = reference(tiny_llama, full)
    start = len(out.prompt_token_ids) - 1
    assert completion.token_stats is not None and len(completion.token_stats) == 5
    for i, (token, stats) in enumerate(zip(completion.token_ids, completion.token_stats)):
        check(stats, expected(ref[start + i], token, k))
        assert stats.rank == completion.logprobs[i][token].rank


def test_sampled_tokens_have_their_true_rank(llm, tiny_llama):
    params = SamplingParams(max_tokens=6, temperature=1.5, seed=3, logprobs=1, token_stats=True)
    out = llm.generate(PROMPT, params)[0]
    completion = out.outputs[0]
    ref = reference(tiny_llama, out.prompt_token_ids + completion.token_ids)
    start = len(out.prompt_token_ids) - 1
    for i, (token, stats) in enumerate(zip(completion.token_ids, completion.token_stats)):
        check(stats, expected(ref[start + i], token, 1))


def test_prompt_positions_match_too(llm, tiny_llama):
    k = 2
    out = llm.generate(PROMPT, greedy(1, prompt_logprobs=k, token_stats=True))[0]
    ids = out.prompt_token_ids
    ref = reference(tiny_llama, ids)
    assert out.prompt_token_stats is not None and len(out.prompt_token_stats) == len(ids)
    assert out.prompt_token_stats[0] is None
    for pos in range(1, len(ids)):
        check(out.prompt_token_stats[pos], expected(ref[pos - 1], ids[pos], k))
    assert out.outputs[0].token_stats is None  # no logprobs asked for the generated token


def test_the_numbers_do_not_depend_on_k(llm):
    runs = [llm.generate(PROMPT, greedy(4, logprobs=k, prompt_logprobs=k, token_stats=True))[0]
            for k in (0, 1, 7, 20)]
    for run in runs[1:]:
        for a, b in zip(runs[0].outputs[0].token_stats, run.outputs[0].token_stats):
            assert (a.entropy, a.rank, a.margin) == pytest.approx((b.entropy, b.rank, b.margin),
                                                                  abs=1e-6)
        for a, b in zip(runs[0].prompt_token_stats[1:], run.prompt_token_stats[1:]):
            assert (a.entropy, a.rank, a.margin) == pytest.approx((b.entropy, b.rank, b.margin),
                                                                  abs=1e-6)
    masses = [[s.top_k_mass for s in run.outputs[0].token_stats] for run in runs]
    assert all(m == 0.0 for m in masses[0])  # k = 0: nothing returned, no mass
    for fewer, more in zip(masses, masses[1:]):  # the mass of the k returned: grows with k
        assert all(a < b for a, b in zip(fewer, more))


def test_batched_with_requests_that_do_not_ask(llm):
    plain = greedy(4, logprobs=2)
    # the same batch shape with and without a neighbour asking (a batch of 1 would be another
    # matrix shape: not every kernel is batch-invariant)
    alone = llm.generate([PROMPT, PROMPT], [plain, plain])[0]
    both = llm.generate([PROMPT, PROMPT], [plain, greedy(4, logprobs=2, token_stats=True)])
    assert both[0].outputs[0].token_stats is None and both[0].prompt_token_stats is None
    assert both[0].outputs[0].token_ids == alone.outputs[0].token_ids
    assert both[0].outputs[0].logprobs == alone.outputs[0].logprobs
    assert both[1].outputs[0].token_stats is not None


def test_without_any_logprobs_it_is_refused_by_name():
    with pytest.raises(ValidationError) as err:
        SamplingParams(token_stats=True)
    assert err.value.parameter == "token_stats"
    with pytest.raises(ValidationError) as err:
        SamplingParams(logprobs=1, token_stats="yes")  # type: ignore[arg-type]
    assert err.value.parameter == "token_stats"


def test_impossible_tokens_add_nothing_and_each_row_keeps_its_k():
    from workbench.engine.requests.token_stats import token_stats

    logits = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")], [3.0, 1.0, 0.0, -1.0]])
    logprobs = logits.log_softmax(-1)
    half, skewed = token_stats(logprobs, torch.tensor([2, 1]), [1, 3])
    assert half.entropy == pytest.approx(float(torch.log(torch.tensor(2.0))))
    assert half.margin == 0.0 and half.top_k_mass == pytest.approx(0.5) and half.rank == 2
    probs = logprobs[1].exp()
    assert skewed.entropy == pytest.approx(float(-(probs * logprobs[1]).sum()), abs=1e-6)
    assert skewed.margin == pytest.approx(2.0, abs=1e-6)
    assert skewed.top_k_mass == pytest.approx(float(probs[:3].sum()), abs=1e-6)


def test_a_prompt_computed_in_chunks_gives_the_same_numbers(llm, tiny_llama):
    chunked = make_llm(tiny_llama, max_num_batched_tokens=4)
    params = greedy(3, logprobs=2, prompt_logprobs=2, token_stats=True)
    whole, parts = llm.generate(PROMPT, params)[0], chunked.generate(PROMPT, params)[0]
    assert len(parts.prompt_token_stats) == len(whole.prompt_token_stats)
    for a, b in zip(whole.prompt_token_stats[1:], parts.prompt_token_stats[1:]):
        assert a.rank == b.rank
        assert (a.entropy, a.margin, a.top_k_mass) == pytest.approx(
            (b.entropy, b.margin, b.top_k_mass), abs=1e-5)
    assert [s.rank for s in parts.outputs[0].token_stats] == \
        [s.rank for s in whole.outputs[0].token_stats]


@needs_c
def test_a_prompt_position_has_the_bits_it_has_when_generated():
    # batch-invariant products: a position's logits are the same bits in a prefill and in a
    # decode step, so its whole token_stats must be too (one entropy sum for both paths)
    llm = make_llm(tiny_model("llama", seed=0, dtype="float32"), batch_invariant=True)
    generated = llm.generate(PROMPT, greedy(4, logprobs=1, token_stats=True))[0]
    ids, completion = generated.prompt_token_ids, generated.outputs[0]
    again = llm.generate({"prompt_token_ids": ids + completion.token_ids},
                         greedy(1, prompt_logprobs=1, token_stats=True))[0]
    for i, token in enumerate(completion.token_ids):
        assert again.prompt_logprobs[len(ids) + i][token] == completion.logprobs[i][token]
        assert again.prompt_token_stats[len(ids) + i] == completion.token_stats[i]
