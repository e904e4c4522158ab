"""The sampler's pure functions on hand-made logits (no model)."""

import torch

from workbench.engine.step.sampler import (
    Sampler,
    SamplingRow,
    apply_penalties,
    apply_token_masks,
    compute_logprobs,
    sample,
    truncate,
)
from workbench.sampling_params import SamplingParams

V = 8


def row(prompt=(0,), output=(), generator=None, stop_ids=(), **params) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), list(prompt), list(output), generator,
                       set(stop_ids))


def logits_of(*values) -> torch.Tensor:
    return torch.tensor([list(values)], dtype=torch.float32)  # [1, V]


BASE = logits_of(0.0, 1.0, 2.0, 3.0, -1.0, -2.0, 0.5, 1.5)


def test_compute_logprobs_matches_log_softmax_with_ranks_and_top_k():
    raw = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    tokens = torch.tensor([0, 3, 7])
    logprobs, chosen, ranks, top_ids, top_lp = compute_logprobs(raw, tokens, 2)
    ref = raw.log_softmax(-1)
    assert torch.allclose(logprobs, ref)
    assert torch.allclose(chosen, ref[torch.arange(3), tokens])
    expected_ranks = [(ref[i] > ref[i, t]).sum().item() + 1 for i, t in enumerate(tokens.tolist())]
    assert ranks.tolist() == expected_ranks
    assert torch.equal(top_ids, ref.topk(2, -1).indices)
    assert torch.allclose(top_lp, ref.topk(2, -1).values)


def test_compute_logprobs_without_top_k_gives_only_the_chosen():
    _, _, _, top_ids, top_lp = compute_logprobs(BASE, torch.tensor([1]), 0)
    assert top_ids is None and top_lp is None


def test_top_k_keeps_the_k_largest():
    out = truncate(BASE.clone(), torch.tensor([2]), torch.tensor([1.0]), torch.tensor([0.0]))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [2, 3]


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    out = truncate(logits, torch.tensor([0]), torch.tensor([0.7]), torch.tensor([0.0]))
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False]


def test_top_p_always_keeps_the_most_likely_token():
    logits = torch.log(torch.tensor([[0.9, 0.1]]))
    out = truncate(logits, torch.tensor([0]), torch.tensor([0.01]), torch.tensor([0.0]))
    assert torch.isfinite(out[0]).tolist() == [True, False]


def test_top_p_off_drops_nothing_where_the_sums_round_past_one():
    """Rows where top-k keeps everything and top-p is 1: every token stays, even where the
    float32 running mass before a token comes out above 1 (these logits: in each row)."""
    logits = torch.randn(16, 300, generator=torch.Generator().manual_seed(0)) * 3
    probs = logits.sort(-1, descending=True).values.softmax(-1)
    assert ((probs.cumsum(-1) - probs) > 1).any(-1).sum() > 0  # the rounding is there
    out = truncate(logits, torch.full((16,), 300), torch.ones(16), torch.zeros(16))
    assert torch.isfinite(out).all()


def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.07, 0.03]]))
    out = truncate(logits, torch.tensor([0]), torch.tensor([1.0]), torch.tensor([0.1]))
    assert torch.isfinite(out[0]).tolist() == [True, True, True, False]


def test_truncation_is_per_row():
    logits = BASE.repeat(2, 1)
    out = truncate(logits, torch.tensor([1, 0]), torch.tensor([1.0, 1.0]), torch.tensor([0.0, 0.0]))
    assert torch.isfinite(out).sum(-1).tolist() == [1, V]


def test_allowed_token_ids_mask_everything_else():
    out = apply_token_masks(BASE.clone(), [row(allowed_token_ids=[1, 4])])
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [1, 4]


def test_a_single_token_bad_word_is_always_banned():
    r = row()
    r.params._bad_words_token_ids = [[3]]
    out = apply_token_masks(BASE.clone(), [r])
    assert out[0, 3] == float("-inf") and torch.isfinite(out[0, :3]).all()


def test_a_multi_token_bad_word_bans_its_last_token_only_after_its_prefix():
    r = row(output=[5, 2])
    r.params._bad_words_token_ids = [[2, 3]]
    assert apply_token_masks(BASE.clone(), [r])[0, 3] == float("-inf")
    r.output_ids = [2, 5]
    assert apply_token_masks(BASE.clone(), [r])[0, 3] == 3.0


def test_min_tokens_bans_stop_ids_until_reached():
    early = row(output=[1], stop_ids={3, 7}, min_tokens=2)
    later = row(output=[1, 1], stop_ids={3, 7}, min_tokens=2)
    out = apply_token_masks(BASE.repeat(2, 1), [early, later])
    assert out[0, [3, 7]].tolist() == [float("-inf")] * 2
    assert out[1, [3, 7]].tolist() == [3.0, 1.5]


def test_logit_bias_is_added():
    out = apply_token_masks(BASE.clone(), [row(logit_bias={0: 10.0, 3: -4.0})])
    assert out[0, 0] == 10.0 and out[0, 3] == -1.0


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    out = apply_penalties(BASE.clone(), [row(prompt=[3], output=[4], repetition_penalty=2.0)])
    assert out[0, 3] == 1.5 and out[0, 4] == -2.0
    assert out[0, 2] == 2.0  # unseen: untouched


def test_presence_and_frequency_penalties_count_output_tokens_only():
    r = row(prompt=[1], output=[2, 2, 6], presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(BASE.clone(), [r])
    assert out[0, 2].item() == 2.0 - 0.5 - 0.5
    assert out[0, 6].item() == 0.5 - 0.5 - 0.25
    assert out[0, 1].item() == 1.0


def test_seeded_rows_draw_the_same_noise_whatever_the_batch():
    probs = torch.softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(1)), -1)
    default = torch.Generator().manual_seed(0)
    alone = sample(probs[2:3], [torch.Generator().manual_seed(7)], default)
    gens = [None, torch.Generator().manual_seed(3), torch.Generator().manual_seed(7), None]
    batched = sample(probs, gens, default)
    assert batched[2] == alone[0]
    again = [sample(probs[2:3], [torch.Generator().manual_seed(7)], default)[0] for _ in range(3)]
    assert all(a == alone[0] for a in again)


def test_sampling_follows_the_distribution():
    probs = torch.tensor([[0.7, 0.2, 0.1]]).repeat(3000, 1)
    draws = sample(probs, [None] * 3000, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=3).float() / 3000
    assert torch.allclose(freq, probs[0], atol=0.03)


def test_sampler_greedy_rows_take_the_argmax_after_masks():
    sampler = Sampler(seed=0, vocab_size=V)
    result = sampler(BASE.clone(), [row(temperature=0.0, logit_bias={5: 10.0})])
    assert result.tokens.tolist() == [5]
    assert result.token_logprobs is None


def test_sampler_logprobs_come_from_the_raw_logits():
    sampler = Sampler(seed=0, vocab_size=V)
    result = sampler(BASE.clone(), [row(temperature=0.0, logprobs=2, logit_bias={5: 10.0})])
    raw = BASE.log_softmax(-1)[0]
    assert abs(result.token_logprobs[0].item() - raw[5].item()) < 1e-6
    assert result.ranks.tolist() == [8] and result.top_ids[0].tolist() == [3, 2]


def test_sampler_cuts_logits_to_the_vocabulary():
    padded = torch.cat([BASE, torch.full((1, 4), 100.0)], dim=1)  # lm_head wider than the vocab
    result = Sampler(seed=0, vocab_size=V)(padded, [row(temperature=0.0)])
    assert result.tokens.tolist() == [3]


def test_sampler_with_a_seed_is_reproducible_across_engines():
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(2))
    draws = []
    for engine_seed in (0, 1):
        sampler = Sampler(seed=engine_seed, vocab_size=100)
        r = row(temperature=1.0, generator=torch.Generator().manual_seed(11))
        draws.append(sampler(logits.clone(), [r]).tokens.item())
    assert draws[0] == draws[1]


def test_the_two_level_cdf_picks_the_token_a_full_cdf_picks():
    """Blocks of CDF_BLOCK tokens, then the one block: the same token as one cumulative sum
    over the whole vocabulary (not a multiple of the block: the last block is padded)."""
    gen = torch.Generator().manual_seed(2)
    probs = torch.softmax(torch.randn(400, 1000, generator=gen) * 4, -1)
    probs[:, 300:700] = 0.0  # whole blocks without mass
    seeds = range(400)
    drawn = sample(probs, [torch.Generator().manual_seed(s) for s in seeds], gen)
    u = torch.cat([torch.rand(1, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
                   for s in seeds])
    cdf = probs.double().cumsum(-1)
    expected = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    assert torch.equal(drawn, expected)


def test_sampling_never_picks_a_token_of_zero_probability():
    probs = torch.zeros(2000, 700)
    probs[:, [0, 255, 256, 699]] = torch.tensor([1e-30, 0.5, 1e-30, 0.5])  # block edges, the end
    draws = sample(probs, [None] * 2000, torch.Generator().manual_seed(0))
    assert set(draws.tolist()) <= {0, 255, 256, 699}
    assert {255, 699} <= set(draws.tolist())
