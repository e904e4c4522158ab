"""`sample_on_device`: the CPU sampler's tokens and masks, seeded rows whatever the batch, the
right distribution, and not one host sync (`tests/engine/host_sync.py`)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.engine.host_sync import HostSync, forbid_host_sync
from workbench.engine.gpu.device_sampling import (
    RowParams,
    sample_on_device,
    truncation_mask,
    uniforms,
)
from workbench.engine.step.sampler import Sampler, SamplingRow, truncate
from workbench.sampling_params import SamplingParams

VOCAB = 300  # not a multiple of the inverse CDF's block: its padding is walked too

# (temperature, top_k, top_p, min_p): greedy, plain, each truncation, all of them
SETTINGS = [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 0, 1.0, 0.0), (1.0, 5, 1.0, 0.0),
            (0.9, 0, 0.8, 0.0), (1.3, 0, 1.0, 0.05), (0.8, 40, 0.9, 0.02), (1e-6, 3, 0.5, 0.0)]


def _rows(settings, seeds) -> list[SamplingRow]:
    rows = []
    for (t, k, p, m), seed in zip(settings, seeds):
        params = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m, seed=seed)
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        rows.append(SamplingRow(params, [1, 2], [], generator, frozenset()))
    return rows


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3  # [B, V]


def test_tokens_are_the_cpu_samplers():
    """Same generators, same logits: the CPU sampler's tokens, step after step."""
    seeds = [None, 11, None, 12, None, 13, 14, None]
    cpu_rows, dev_rows = _rows(SETTINGS, seeds), _rows(SETTINGS, seeds)
    cpu = Sampler(seed=7, vocab_size=VOCAB)
    default = torch.Generator().manual_seed(7)
    params = RowParams.of(dev_rows, "cpu")
    for step in range(25):
        logits = _logits(len(SETTINGS), step)
        want = cpu(logits, cpu_rows).tokens
        got = sample_on_device(logits, params, [r.generator for r in dev_rows], default)
        assert got.dtype == torch.long and torch.equal(got, want), step


def test_greedy_rows_take_the_argmax():
    logits = _logits(4)
    logits[2, 17] = logits[2].max() + 1e-3  # a near tie
    params = RowParams.of(_rows([(0.0, 0, 1.0, 0.0)] * 4, [None] * 4), "cpu")
    tokens = sample_on_device(logits, params, [None] * 4, torch.Generator().manual_seed(0))
    assert torch.equal(tokens, logits.argmax(-1)) and int(tokens[2]) == 17


@pytest.mark.parametrize("seed", range(4))
def test_masks_are_truncates(seed):
    """Each row's excluded tokens are those `sampler.truncate` sets to -inf, in batches where
    every row truncates (min-p, top-k, top-p: truncate's branches all taken)."""
    g = torch.Generator().manual_seed(seed)
    logits = _logits(16, seed)
    top_k = torch.randint(1, VOCAB, (16,), generator=g)
    top_p = torch.rand(16, generator=g) * 0.9 + 0.05
    min_p = torch.rand(16, generator=g) * 0.2
    for k, p, m in ((top_k, top_p, min_p), (top_k, torch.ones(16), torch.zeros(16)),
                    (torch.zeros(16, dtype=torch.long), top_p, torch.zeros(16)),
                    (torch.zeros(16, dtype=torch.long), torch.ones(16), min_p)):
        want = truncate(logits, k, p, m) == float("-inf")
        assert torch.equal(truncation_mask(logits, k, p, m), want)
        assert want.any()  # the test truncates something


def test_nothing_masked_where_truncation_is_off():
    logits = _logits(3)
    off = truncation_mask(logits, torch.zeros(3, dtype=torch.long), torch.ones(3),
                          torch.zeros(3))
    assert not off.any()


def test_seeded_row_is_the_same_whatever_the_batch():
    setting = (0.9, 50, 0.95, 0.0)

    def tokens(batch: int, at: int) -> list[int]:
        settings = [SETTINGS[(i + 1) % len(SETTINGS)] for i in range(batch)]
        seeds: list[int | None] = [None] * batch
        settings[at], seeds[at] = setting, 1234
        rows = _rows(settings, seeds)
        params = RowParams.of(rows, "cpu")
        default = torch.Generator().manual_seed(batch)
        out = []
        for step in range(10):
            logits = _logits(batch, 100 + step)
            logits[at] = _logits(1, step)[0]  # the seeded row's logits: the same in every batch
            out.append(int(sample_on_device(logits, params, [r.generator for r in rows],
                                            default)[at]))
        return out

    alone = tokens(1, 0)
    assert tokens(5, 3) == alone and tokens(8, 0) == alone
    assert len(set(alone)) > 1  # really drawn


def test_draws_follow_the_truncated_distribution():
    """20,000 draws of one row (as 20,000 rows of one call) against softmax(logits / T) over
    the top-k: a chi-square test at p = 0.001 (df = 5), nothing outside the top-k."""
    n, k, temperature = 20_000, 6, 0.8
    base = torch.tensor([2.0, 1.5, 1.0, 0.8, 0.1, -0.5, -1.0, -3.0])  # [8]
    logits = base.expand(n, -1).contiguous()
    params = RowParams(torch.full((n,), temperature), torch.full((n,), k),
                       torch.ones(n), torch.zeros(n))
    tokens = sample_on_device(logits, params, [None] * n, torch.Generator().manual_seed(0))
    counts = torch.bincount(tokens, minlength=8).double()  # [8]
    assert counts[k:].sum() == 0
    expected = (base[:k] / temperature).softmax(-1).double() * n
    chi2 = float(((counts[:k] - expected) ** 2 / expected).sum())
    assert chi2 < 20.52, (counts.tolist(), expected.tolist())  # chi-square(5) at p = 0.001


def test_uniforms_draw_as_the_cpu_sampler():
    """Unseeded rows in one call of the default generator, in row order; seeded rows each
    from its own; a greedy row draws nothing."""
    default, own = torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)
    u = uniforms([None, own, None, None], [True, True, False, True], default,
                 torch.device("cpu"))
    shared = torch.rand(2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    mine = torch.rand(1, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert torch.equal(u, torch.stack([shared[0], mine[0], torch.tensor(0.0).double(),
                                       shared[1]]))


def test_no_host_sync():
    rows = _rows(SETTINGS, [None, 1, None, 2, None, 3, 4, None])
    params = RowParams.of(rows, "cpu")
    logits = _logits(len(rows))
    default = torch.Generator().manual_seed(0)
    with forbid_host_sync():
        tokens = sample_on_device(logits, params, [r.generator for r in rows], default)
    assert tokens.shape == (len(rows),)


@pytest.mark.parametrize("syncs", [
    lambda x: x.sum().item(), lambda x: bool((x > 0).any()), lambda x: x.tolist(),
    lambda x: x[x > 0], lambda x: torch.nonzero(x), lambda x: int(x.argmax()),
    lambda x: math.floor(x.max()),
    lambda x: truncate(x.unsqueeze(0), torch.zeros(1, dtype=torch.long), torch.ones(1),
                       torch.zeros(1)),
])
def test_the_guard_catches_syncs(syncs):
    """`forbid_host_sync` does fail: each of these (the CPU sampler's `truncate` among them)
    waits for the device."""
    with pytest.raises(HostSync), forbid_host_sync():
        syncs(torch.randn(8))


def test_one_generator_per_row():
    with pytest.raises(ValueError, match="one per row"):
        sample_on_device(_logits(2), RowParams.of(_rows(SETTINGS[:2], [None, None]), "cpu"),
                         [None], torch.Generator())
