"""Turns logits into tokens, as a chain of pure functions over tensors.

Order as vLLM v1: logprobs are taken from the raw logits (`--logprobs-mode raw_logprobs`);
then allowed-token masks, bad words, min_tokens, logit bias and the repetition / presence /
frequency penalties edit the logits; greedy rows take the argmax; the others go through
temperature, min_p, top-k and top-p and are sampled by inverse CDF (one uniform draw per row).
A row whose request has a seed draws from its own `torch.Generator`, so its samples do not
depend on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from workbench.engine.kernels import c_layer_ops
from workbench.engine.requests.outputs import TokenStats
from workbench.engine.requests.token_stats import token_stats
from workbench.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    """What the sampler needs to know about one row of logits."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None
    stop_ids: frozenset[int]  # EOS and stop ids, banned while output < min_tokens
    grammar_mask: torch.Tensor | None = None  # [V] bool: what a structured-output grammar allows
    forced_token: int | None = None  # the only token allowed (a reasoning past its budget)


@dataclass
class SampleResult:
    tokens: torch.Tensor  # [R] sampled ids
    token_logprobs: torch.Tensor | None  # [R] raw logprob of the sampled token
    ranks: torch.Tensor | None  # [R] rank of the sampled token (1 = most likely)
    top_ids: torch.Tensor | None  # [R, K] top-K ids by raw logprob
    top_logprobs: torch.Tensor | None  # [R, K]
    # per row: (ids, raw logprobs, ranks) of its `logprob_token_ids`, None where it has none
    tracked: list[tuple[list[int], list[float], list[int]] | None] | None = None
    # per row: its `TokenStats` when its request asked for `token_stats`, else None
    stats: list[TokenStats | None] | None = None


def apply_token_masks(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Allowed ids, bad words, min_tokens and logit bias, row by row (rarely used, cheap);
    then the grammar mask, which wins if the others left its row no token at all; a forced
    token (a reasoning past its `thinking_token_budget`) wins over everything."""
    for i, row in enumerate(rows):
        p = row.params
        # a grammar row keeps its logits as they were before the edits below
        grammar = (row.grammar_mask, logits[i].clone()) if row.grammar_mask is not None else None
        if p.allowed_token_ids is not None:
            keep = torch.full_like(logits[i], float("-inf"))
            keep[p.allowed_token_ids] = 0.0
            logits[i] += keep
        for words in p._bad_words_token_ids:
            prefix = words[:-1]
            if not prefix or row.output_ids[-len(prefix):] == prefix:
                logits[i, words[-1]] = float("-inf")
        if len(row.output_ids) < p.min_tokens and row.stop_ids:
            logits[i, list(row.stop_ids)] = float("-inf")
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), device=logits.device)
            logits[i, ids] += torch.tensor(list(p.logit_bias.values()), device=logits.device)
        if grammar is not None:
            mask, before = grammar
            allowed = mask.to(logits.device)
            logits[i] = logits[i].masked_fill(~allowed, float("-inf"))
            if not bool(torch.isfinite(logits[i]).any()):  # e.g. min_tokens banned EOS at the end
                logits[i] = before.masked_fill(~allowed, float("-inf"))
        if row.forced_token is not None:
            logits[i] = float("-inf")
            logits[i, row.forced_token] = 0.0
    return logits


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Repetition (prompt + output, HF-style), presence and frequency (output) penalties."""
    idx = [i for i, r in enumerate(rows)
           if r.params.repetition_penalty != 1.0 or r.params.presence_penalty
           or r.params.frequency_penalty]
    vocab = logits.shape[1]
    for i in idx:
        p, row = rows[i].params, rows[i]
        out = torch.tensor(row.output_ids, dtype=torch.long, device=logits.device)
        counts = torch.zeros(vocab, device=logits.device).index_add_(
            0, out, torch.ones(len(out), device=logits.device))  # [V]
        if p.repetition_penalty != 1.0:
            seen = counts > 0
            seen[torch.tensor(row.prompt_ids, dtype=torch.long, device=logits.device)] = True
            penalised = torch.where(logits[i] > 0, logits[i] / p.repetition_penalty,
                                    logits[i] * p.repetition_penalty)
            logits[i] = torch.where(seen, penalised, logits[i])
        logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
    return logits


def truncate(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
             min_p: torch.Tensor) -> torch.Tensor:
    """Masks to -inf what top-k [R], top-p [R] and min-p [R] exclude (0 / 1 / 0 = off)."""
    if bool((min_p > 0).any()):
        probs = logits.softmax(-1)
        cutoff = probs.max(-1, keepdim=True).values * min_p.unsqueeze(1)
        logits = logits.masked_fill(probs < cutoff, float("-inf"))
    if bool((top_k > 0).any()) or bool((top_p < 1).any()):
        sorted_logits, order = logits.sort(-1, descending=True)  # [R, V]
        ranks = torch.arange(logits.shape[1], device=logits.device).unsqueeze(0)
        k = torch.where(top_k > 0, top_k, logits.shape[1]).unsqueeze(1)
        drop = ranks >= k
        sorted_probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(-1)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass strictly above each token
        # where top-p is off (1) nothing is dropped, even where rounding takes `before` past 1
        drop |= (before > top_p.unsqueeze(1)) & (ranks > 0) & (top_p < 1).unsqueeze(1)
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return logits


CDF_BLOCK = 256  # tokens per block of the two-level inverse CDF in `sample`


def sample(probs: torch.Tensor, generators: list[torch.Generator | None],
           default: torch.Generator) -> torch.Tensor:
    """Inverse-CDF sampling from probs [R, V]: one uniform per row, from the row's own
    generator when its request is seeded, else from the engine's (one call for all of them).

    The CDF is walked in two levels: the cumulative mass of blocks of `CDF_BLOCK` tokens finds
    the block the target falls in, then the cumulative mass inside that block finds the token
    (a cumulative sum over the whole vocabulary was the slowest part of a sampling step). The
    chosen token is the one a single full-length CDF gives, up to rounding, and never one of
    zero probability."""
    u = torch.empty(probs.shape[0], dtype=torch.float64)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if unseeded:
        u[unseeded] = torch.rand(len(unseeded), generator=default, dtype=torch.float64)
    for i, g in enumerate(generators):
        if g is not None:
            u[i] = torch.rand(1, generator=g, dtype=torch.float64)
    return inverse_cdf(probs, u.to(probs.device))


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token of each row of probs [R, V] at which its cumulative mass passes u [R] (float64,
    in [0, 1), on probs' device) times the row's total: `sample`'s two-level walk, with no host
    sync (`engine/gpu/device_sampling.py` calls it on the device)."""
    rows, vocab = probs.shape
    pad = -vocab % CDF_BLOCK
    blocks = (F.pad(probs, (0, pad)) if pad else probs).reshape(rows, -1, CDF_BLOCK)  # [R, B, W]
    block_cdf = blocks.sum(-1).to(torch.float64).cumsum(-1)  # [R, B]
    total = block_cdf[:, -1:]  # [R, 1]
    target = _below(u.unsqueeze(1) * total, total)
    block = torch.searchsorted(block_cdf, target, right=True)  # [R, 1]: its mass passes target
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    chosen = blocks[torch.arange(rows, device=probs.device), block.squeeze(1)]  # [R, W]
    inner_cdf = chosen.to(torch.float64).cumsum(-1)
    inner = torch.searchsorted(inner_cdf, _below(target - before, inner_cdf[:, -1:]), right=True)
    return (block * CDF_BLOCK + inner).squeeze(1)


def _below(target: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """`target`, kept strictly below `total`: the first cumulative mass past it then belongs
    to a token (or block) of non-zero probability."""
    return torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))


def compute_logprobs(raw: torch.Tensor, tokens: torch.Tensor, k: int):
    """Raw logprobs [R, V], those of the sampled tokens, their ranks, and each row's top-k."""
    logprobs = raw.log_softmax(-1)  # [R, V]
    chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)  # [R]
    fast = c_layer_ops.ranks_and_top_k(logprobs, tokens, k) if k > 0 else None
    if fast is not None:  # one pass in C
        return logprobs, chosen, *fast
    ranks = (logprobs > chosen.unsqueeze(1)).sum(-1) + 1  # [R]
    top_lp, top_ids = logprobs.topk(k, dim=-1) if k > 0 else (None, None)
    return logprobs, chosen, ranks, top_ids, top_lp


def tracked_logprobs(logprobs: torch.Tensor, ids: list[int]) -> tuple[list[int], list[float],
                                                                       list[int]]:
    """One row's raw logprobs [V] at `ids`, and their ranks (1 = most likely)."""
    index = torch.tensor(ids, device=logprobs.device)
    values = logprobs.index_select(0, index)  # [m]
    ranks = (logprobs.unsqueeze(0) > values.unsqueeze(1)).sum(-1) + 1  # [m]
    return list(ids), values.tolist(), ranks.tolist()


def _edits_logits(p: SamplingParams) -> bool:
    """Whether any mask, bias or penalty applies to this row."""
    return bool(p.allowed_token_ids is not None or p._bad_words_token_ids or p.min_tokens
                or p.logit_bias or p.repetition_penalty != 1.0 or p.presence_penalty
                or p.frequency_penalty)


class Sampler:
    """Applies the chain above to a batch of rows, with one default generator per engine."""

    def __init__(self, seed: int, vocab_size: int):
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SampleResult:
        """logits: [R, V] float32 raw logits, one row per `rows` entry."""
        logits = logits[:, :self.vocab_size]
        raw = logits
        if any(_edits_logits(r.params) or r.grammar_mask is not None
               or r.forced_token is not None for r in rows):
            logits = apply_penalties(apply_token_masks(logits.clone(), rows), rows)
        greedy = [i for i, r in enumerate(rows) if r.params.greedy]
        sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
        tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
        if len(greedy) == len(rows):
            tokens = logits.argmax(-1)
        elif greedy:
            tokens[greedy] = logits[greedy].argmax(-1)
        if sampled:
            dev = logits.device
            sub = logits if len(sampled) == len(rows) else logits[sampled]
            temps = [rows[i].params.temperature for i in sampled]
            if any(t != 1.0 for t in temps):
                sub = sub / torch.tensor(temps, device=dev).unsqueeze(1)
            sub = truncate(
                sub,
                torch.tensor([rows[i].params.top_k for i in sampled], device=dev),
                torch.tensor([rows[i].params.top_p for i in sampled], device=dev),
                torch.tensor([rows[i].params.min_p for i in sampled], device=dev),
            )
            gens = [rows[i].generator for i in sampled]
            tokens[sampled] = sample(sub.softmax(-1), gens, self.generator)
        want = [i for i, r in enumerate(rows) if r.params.wants_logprobs]
        if not want:
            return SampleResult(tokens, None, None, None, None)
        k = max(rows[i].params.num_logprobs(self.vocab_size) or 0 for i in want)
        if any(rows[i].params.token_stats for i in want):  # its margin: the top two
            k = max(k, min(2, raw.shape[1]))
        logprobs, chosen, ranks, top_ids, top_lp = compute_logprobs(raw, tokens, k)
        tracked = [tracked_logprobs(logprobs[i], r.params.logprob_token_ids)
                   if r.params.logprob_token_ids else None for i, r in enumerate(rows)]
        return SampleResult(tokens, chosen, ranks, top_ids, top_lp, tracked,
                            self._stats(logprobs, ranks, top_lp, rows))

    def _stats(self, logprobs: torch.Tensor, ranks: torch.Tensor, top: torch.Tensor | None,
               rows: list[SamplingRow]) -> list[TokenStats | None] | None:
        """`token_stats` of the rows that asked, from the full raw logprobs [R, V] (and the
        top logprobs already taken)."""
        asked = [i for i, r in enumerate(rows) if r.params.token_stats and r.params.wants_logprobs]
        if not asked:
            return None
        ks = [rows[i].params.num_logprobs(self.vocab_size) or 0 for i in asked]
        index = torch.tensor(asked, device=logprobs.device)
        asked_logprobs = logprobs.index_select(0, index)
        found = token_stats(asked_logprobs, ranks.index_select(0, index), ks,
                            None if top is None else top.index_select(0, index),
                            c_layer_ops.entropy(asked_logprobs))
        stats: list[TokenStats | None] = [None] * len(rows)
        for i, one in zip(asked, found):
            stats[i] = one
        return stats
