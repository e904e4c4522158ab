"""`token_stats`: the whole next-token distribution of some rows, summed up exactly.

Computed from the same full-vocabulary raw logprobs the rows' logprobs come from (the sampler's
for generated positions, the prompt-logprob path's for prompt positions), so entropy, rank and
margin are those of the model's distribution whatever top-k the request returns.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from workbench.engine.requests.outputs import TokenStats


def token_stats(logprobs: torch.Tensor, ranks: torch.Tensor, ks: list[int],
                top: torch.Tensor | None = None, entropy: torch.Tensor | None = None
                ) -> list[TokenStats]:
    """One `TokenStats` per row of `logprobs` [R, V] (log_softmax over the whole vocabulary):
    `ranks` [R] are the rows' tokens' ranks, `ks` each row's returned top-k count; `top` the
    rows' largest logprobs, best first, at least `max(ks)` and 2 of them where the caller has
    them already (the sampler's), else taken here; `entropy` [R] where the caller computed it
    (the sampler and the prompt positions' path, in C: `c_layer_ops.entropy`, float64 sums),
    else here in torch (float32 terms and sums)."""
    if entropy is None:
        # p log p in place; 0 * log 0 = 0: masked (-inf) tokens add nothing to the entropy
        # (their 0 * -inf is NaN, set to 0)
        entropy = -row_sums(logprobs.exp().mul_(logprobs).nan_to_num_(nan=0.0))
    width = min(max(max(ks, default=0), 2), logprobs.shape[1])
    top = logprobs.topk(width, dim=-1).values if top is None or top.shape[1] < width \
        else top[:, :width]  # [R, width], best first
    rows = top.tolist()  # one transfer; the few numbers a row needs are then Python's
    columns = zip(entropy.tolist(), ranks.tolist(), rows, ks)
    return [TokenStats(entropy=e, rank=int(r), margin=row[0] - row[1] if width > 1 else math.inf,
                       top_k_mass=math.fsum(map(math.exp, row[:k])))
            for e, r, row, k in columns]


def row_sums(x: torch.Tensor) -> torch.Tensor:
    """Each row of `x` [R, V] summed in one order whatever the thread count: torch's `sum(-1)`
    splits a long row among its threads (a process of 2 threads and a Ray replica of 1 part in
    the last bits); NumPy's pairwise sum runs on one thread. On a GPU, torch's own (one order per
    shape there)."""
    if x.device.type != "cpu":
        return x.sum(-1)
    return torch.from_numpy(np.add.reduce(x.numpy(), axis=-1))
