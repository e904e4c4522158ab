"""Sampling where the logits are, with no host sync: the sampler's chain as fixed tensor ops.

`engine/step/sampler.py` decides on the host what each step needs (`bool((min_p > 0).any())`, lists
of greedy and sampled rows, uniforms drawn on the CPU and copied in): right on the CPU, where a
host "sync" costs nothing, but on a GPU each such decision waits for the device. Here every row
goes through every stage, each one a no-op where its parameter is off (top-k 0, top-p 1, min-p
0), greedy rows (temperature below `SamplingParams.greedy`'s epsilon) take the argmax of their
logits through a `torch.where`, and the uniforms are drawn on the logits' device: one call of the
default generator for the unseeded rows, one draw of its own generator per seeded row, so a
seeded request gets the same tokens whatever shares its batch. The truncation masks are the CPU
sampler's (`truncate`) row for row and the walk down the CDF is its `inverse_cdf`: on the CPU,
with the same generators, the tokens are the CPU sampler's (`tests/engine/gpu/test_device_sampling.py`).

Not wired yet: the CUDA runner will call `sample_on_device` where `Sampler.__call__` takes its
greedy / sampled branches (masks, penalties and logprobs stay as they are).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from workbench.engine.step.sampler import SamplingRow, inverse_cdf
from workbench.sampling_params import _SAMPLING_EPS as GREEDY_BELOW  # SamplingParams.greedy's


@dataclass(frozen=True)
class RowParams:
    """Per-row sampling parameters as tensors on the logits' device."""

    temperature: torch.Tensor  # [B] float32; below GREEDY_BELOW: greedy
    top_k: torch.Tensor  # [B] int64; 0: off
    top_p: torch.Tensor  # [B] float32; 1: off
    min_p: torch.Tensor  # [B] float32; 0: off
    # on the host: which rows draw a uniform (not the greedy ones, as the CPU sampler's);
    # None: every row
    draws: tuple[bool, ...] | None = None

    @classmethod
    def of(cls, rows: Sequence[SamplingRow], device: torch.device | str) -> RowParams:
        """The rows' parameters, built on the host and copied over once (non-blocking from
        pinned memory on a GPU)."""
        host = torch.tensor([[r.params.temperature, r.params.top_k, r.params.top_p,
                              r.params.min_p] for r in rows], dtype=torch.float64)  # [B, 4]
        if torch.device(device).type == "cuda":
            host = host.pin_memory()
        table = host.to(device, non_blocking=True)
        return cls(table[:, 0].float(), table[:, 1].long(), table[:, 2].float(),
                   table[:, 3].float(), tuple(not r.params.greedy for r in rows))


def truncation_mask(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                    min_p: torch.Tensor) -> torch.Tensor:
    """[B, V] bool, True where min-p [B], top-k [B] or top-p [B] excludes the token: the masks
    of `sampler.truncate`, computed for every row (each a no-op where its parameter is off)."""
    probs = logits.softmax(-1)  # [B, V]
    cutoff = probs.max(-1, keepdim=True).values * min_p.unsqueeze(1)  # 0 where min-p is off
    excluded = probs < cutoff
    logits = logits.masked_fill(excluded, float("-inf"))
    sorted_logits, order = logits.sort(-1, descending=True)  # [B, V]
    ranks = torch.arange(logits.shape[1], device=logits.device).unsqueeze(0)  # [1, V]
    k = torch.where(top_k > 0, top_k, logits.shape[1]).unsqueeze(1)  # [B, 1]
    drop = ranks >= k
    sorted_probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
    before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly above each token
    # where top-p is off (1) nothing is dropped, even where rounding takes `before` past 1
    drop |= (before > top_p.unsqueeze(1)) & (ranks > 0) & (top_p < 1).unsqueeze(1)
    return excluded | drop.scatter(1, order, drop)


def uniforms(generators: Sequence[torch.Generator | None], draws: Sequence[bool],
             default: torch.Generator, device: torch.device) -> torch.Tensor:
    """One float64 uniform per row [B] on `device`, drawn as the CPU sampler draws them: the
    unseeded rows' in one call of `default`, each seeded row's from its own generator (all of
    them generators of `device`); a row that does not draw (greedy) gets 0 and advances no
    generator."""
    unseeded = sum(g is None and d for g, d in zip(generators, draws))
    shared = torch.rand(unseeded, generator=default, dtype=torch.float64, device=device)
    zero = torch.zeros(1, dtype=torch.float64, device=device)
    parts, taken = [], 0
    for g, d in zip(generators, draws):
        if not d:
            parts.append(zero)
        elif g is None:
            parts.append(shared[taken:taken + 1])
            taken += 1
        else:
            parts.append(torch.rand(1, generator=g, dtype=torch.float64, device=device))
    return torch.cat(parts) if parts else shared[:0]


def sample_on_device(logits: torch.Tensor, params: RowParams,
                     generators: Sequence[torch.Generator | None],
                     default: torch.Generator) -> torch.Tensor:
    """Token ids [B] (int64, on the logits' device) for logits [B, V] (already masked and
    penalised): greedy rows their argmax, the others drawn after temperature, min-p, top-k and
    top-p. `generators[i]` is row i's own generator (a seeded request's), None for the rows that
    share `default`; every generator is one of the logits' device. No host sync."""
    if len(generators) != logits.shape[0]:
        raise ValueError(f"generators: one per row of logits, got {len(generators)} for "
                         f"{logits.shape[0]} rows")
    greedy = params.temperature < GREEDY_BELOW  # [B]
    temperature = torch.where(greedy, 1.0, params.temperature).unsqueeze(1)  # [B, 1]
    scaled = logits / temperature  # division by 1.0 is exact: the CPU sampler's bits
    scaled = scaled.masked_fill(truncation_mask(scaled, params.top_k, params.top_p,
                                                params.min_p), float("-inf"))
    draws = params.draws or (True,) * len(generators)
    u = uniforms(generators, draws, default, logits.device)
    drawn = inverse_cdf(scaled.softmax(-1), u)  # [B]
    return torch.where(greedy, logits.argmax(-1), drawn)
