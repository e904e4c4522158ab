"""What one request's capture and logit lens have recorded, position by position.

Each engine step that computes some of the request's positions adds their rows (`add`,
`add_pattern`, `add_lens`), keyed by absolute position: a position computed again (after a
preemption, whose sequence is recomputed) replaces what it had. When the request finishes,
`activations()` and `lens()` assemble them into the engine's plain data, `ActivationData` and
`LogitLensData` (`workbench.inside.recorded`), with what is absent stated: the last sampled
token is never run through the model, so it has no activations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from workbench.inside.recorded import ActivationData, LogitLensData
from workbench.inside.resolve import Inside


@dataclass
class LensCell:
    """The logit lens at one layer and position."""

    top_ids: torch.Tensor  # [k] int64
    top_probs: torch.Tensor  # [k] float32
    ranks: torch.Tensor  # [len(token_ids)] int64, 0 = the most likely
    probs: torch.Tensor  # [len(token_ids)] float32


@dataclass
class Recording:
    """A request's recorded rows (see the module docstring)."""

    inside: Inside  # the request's, resolved
    num_prompt: int
    num_layers: int  # of the model
    rows: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)  # name -> pos -> [W]
    patterns: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)  # l -> pos -> [h, K]
    lens_cells: dict[int, dict[int, LensCell]] = field(default_factory=dict)  # l -> pos -> cell

    def add(self, name: str, first: int, rows: torch.Tensor) -> None:
        """rows [n, W] of positions first .. first + n - 1 (copied off the step's buffers)."""
        store = self.rows.setdefault(name, {})
        copied = rows.detach().to("cpu", torch.float32, copy=True)  # never a view: the step
        for i, row in enumerate(copied.unbind(0)):  # may change its buffer in place later
            store[first + i] = row

    def add_pattern(self, layer: int, position: int, probs: torch.Tensor) -> None:
        """probs [heads, position + 1] of the query at `position`."""
        self.patterns.setdefault(layer, {})[position] = probs.detach().to(
            "cpu", torch.float32, copy=True)

    def add_lens(self, layer: int, position: int, cell: LensCell) -> None:
        self.lens_cells.setdefault(layer, {})[position] = cell

    def activations(self, tokens: list[str]) -> ActivationData:
        """What the capture recorded, for a sequence of `tokens` (texts, prompt then
        generated)."""
        capture = self.inside.capture
        assert capture is not None
        computed = sorted({p for store in self.rows.values() for p in store}
                          | {p for store in self.patterns.values() for p in store})
        tensors: dict[str, torch.Tensor] = {}
        missing: dict[str, str] = {}
        for name in capture.names:
            if name.endswith("hook_pattern"):
                layer = int(name.split(".")[1])
                got = self.patterns.get(layer, {})
                if got:
                    tensors[name] = _pattern(got)
                    continue
            else:
                got = self.rows.get(name, {})
                if got:
                    stacked = torch.stack([got[p] for p in sorted(got)])  # [P, W]
                    tensors[name] = _reduce(stacked, capture.reduce)
                    continue
            missing[name] = "no position it asked for was computed"
        last = len(tokens) - 1
        if capture.positions.selects(last, self.num_prompt) and last not in computed:
            missing[f"position {last}"] = ("the last token is sampled, never run through the "
                                           "model: no position after it needs its activations")
        positions = sorted({p for store in self.rows.values() for p in store}) or \
            sorted({p for store in self.patterns.values() for p in store})
        heads = capture.heads
        return ActivationData(
            tokens=tokens, num_layers=self.num_layers, tensors=tensors, positions=positions,
            reduce=capture.reduce, missing=missing, pattern_heads={
                int(n.split(".")[1]): list(heads) if heads else list(range(tensors[n].shape[0]))
                for n in tensors if n.endswith("hook_pattern")})

    def lens(self, tokens: list[str], text: Callable[[int], str]) -> LogitLensData:
        """What the logit lens recorded, for a sequence of `tokens`; `text(id)`: a token's."""
        lens = self.inside.logit_lens
        assert lens is not None
        positions = sorted({p for cells in self.lens_cells.values() for p in cells})
        layers = [layer for layer in lens.layers if layer in self.lens_cells]
        grid = [[self.lens_cells[layer][p] for p in positions] for layer in layers]

        def stack(attr: str) -> torch.Tensor:  # [Lyr, P, ...]
            return torch.stack([torch.stack([getattr(c, attr) for c in row]) for row in grid]) \
                if grid and positions else torch.zeros(len(layers), 0, 0)

        ranks, probs = stack("ranks"), stack("probs")
        top = stack("top_ids")
        return LogitLensData(
            tokens=tokens, layers=layers, positions=positions, top_ids=top,
            top_probs=stack("top_probs"),
            top_tokens=[[[text(int(t)) for t in cell] for cell in row] for row in top.tolist()],
            token_ranks={t: ranks[..., i] for i, t in enumerate(lens.token_ids)},
            token_probs={t: probs[..., i] for i, t in enumerate(lens.token_ids)})


def _reduce(stacked: torch.Tensor, how: str | None) -> torch.Tensor:
    if how == "mean":
        return stacked.mean(0)
    if how == "last":
        return stacked[-1]
    return stacked


def _pattern(by_position: dict[int, torch.Tensor]) -> torch.Tensor:
    """{query position: [h, position + 1]} -> [h, Q, K] zero beyond each query's keys."""
    positions = sorted(by_position)
    heads = by_position[positions[0]].shape[0]
    out = torch.zeros(heads, len(positions), positions[-1] + 1)
    for q, p in enumerate(positions):
        out[:, q, :p + 1] = by_position[p]
    return out
