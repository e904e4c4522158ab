"""The LoRA layer: a wrapper around a model's projection that adds each token row's adapter.

The engine's `lora_manager.attach` wraps every adaptable projection (`TARGETS`) in a
`LoRALinear`. A wrapper computes the base projection unchanged, then, for each
resident adapter slot that rows of the current step use, adds `x @ A^T @ B^T * scaling` to
those rows only (the step's ragged batch mixes adapters and the base model; base rows are
untouched, nothing is merged into the weights, nothing is re-batched).

Fused projections (`engine/step/fusion.py`: Q/K/V and gate/up as one matmul in reduced precision)
get one wrapper around the fused matmul with one *part* per original projection: the delta of
each part is computed on its own and added to its columns, so the result is bit-identical to
the unfused projections with their deltas.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

TARGETS = (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
           ("mlp", ("gate_proj", "up_proj", "down_proj")))

# one part of one slot: (A [r, in], B [out, r], scaling)
PartWeights = tuple[torch.Tensor, torch.Tensor, float]


@dataclass
class LoRABatch:
    """The current step: how many token rows, and which rows each used slot adapts."""

    num_tokens: int
    groups: list[tuple[int, torch.Tensor | None]] = field(default_factory=list)  # None: all rows


class LoRAState:
    """Shared by every wrapper of one model; the manager sets `batch` around a forward."""

    def __init__(self, max_loras: int):
        self.max_loras = max_loras
        self.batch: LoRABatch | None = None


class LoRALinear(nn.Module):
    """`base(x)` plus, per slot used this step, its rows' low-rank delta (one per part)."""

    def __init__(self, base: nn.Module, in_features: int, sizes: list[int], state: LoRAState):
        super().__init__()
        self.base = base
        self.in_features = in_features
        self.sizes = list(sizes)
        self.out_features = sum(sizes)
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.reset(state)

    def reset(self, state: LoRAState) -> None:
        """Empty slots under `state` (a later engine on the same model takes the wrapper over)."""
        self.state = state
        self.slots: list[list[PartWeights | None]] = [
            [None] * len(self.sizes) for _ in range(state.max_loras)]

    def set_slot(self, slot: int, part: int, weights: PartWeights | None) -> None:
        self.slots[slot][part] = weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        batch = self.state.batch
        if batch is None or not batch.groups:
            return out
        flat_x = x.reshape(-1, self.in_features)
        if flat_x.shape[0] != batch.num_tokens:  # called outside the runner's step: base only
            return out
        flat_out = out.view(-1, self.out_features)
        single = len(self.sizes) == 1
        for slot, rows in batch.groups:
            xs = None
            for part, weights in enumerate(self.slots[slot]):
                if weights is None:
                    continue
                if xs is None:
                    xs = flat_x if rows is None else flat_x.index_select(0, rows)
                a, b, scaling = weights
                delta = F.linear(F.linear(xs, a), b) * scaling  # as PEFT: B(A(x)) * scaling
                target = flat_out if single else flat_out.narrow(
                    1, self.offsets[part], self.sizes[part])
                if rows is None:
                    target.add_(delta)
                else:
                    target.index_add_(0, rows, delta)
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, parts={self.sizes}"
