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
from typing import Any

import torch

from workbench.inside.recorded import ActivationData, FeatureData, LogitLensData
from workbench.inside.resolve import Inside


@dataclass
class LensCell:
    """The logit lens at one layer and position."""

    top_ids: torch.Tensor  # [k] int64
    top_probs: torch.Tensor  # [k] float32
    ranks: torch.Tensor  # [len(token_ids)] int64, 0 = the most likely
    probs: torch.Tensor  # [len(token_ids)] float32


@dataclass
class FeatureCell:
    """An SAE's features at one position."""

    top_ids: torch.Tensor  # [k] int64, the most active first
    top_values: torch.Tensor  # [k] float32
    values: torch.Tensor  # [len(indices)] float32, the named features'
    l0: int
    error_norm: float


@dataclass
class Recording:
    """A request's recorded rows (see the module docstring)."""

    inside: Inside  # the request's, resolved
    num_prompt: int
    num_layers: int  # of the model
    # name -> the chunks of rows as they came: (first position, [n, W]); a position recorded
    # twice (a recomputed prefix) keeps its latest row
    rows: dict[str, list[tuple[int, torch.Tensor]]] = field(default_factory=dict)
    patterns: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)  # l -> pos -> [h, K]
    lens_cells: dict[int, dict[int, LensCell]] = field(default_factory=dict)  # l -> pos -> cell
    feature_cells: dict[int, FeatureCell] = field(default_factory=dict)  # pos -> cell

    def add(self, name: str, first: int, rows: torch.Tensor) -> None:
        """rows [n, W] of positions first .. first + n - 1 (copied off the step's buffers)."""
        # never a view: the step may change its buffer in place later
        self.rows.setdefault(name, []).append(
            (first, rows.detach().to("cpu", torch.float32, copy=True)))

    def add_pattern(self, layer: int, position: int, probs: torch.Tensor) -> None:
        """probs [heads, position + 1] of the query at `position`."""
        self.patterns.setdefault(layer, {})[position] = probs.detach().to(
            "cpu", torch.float32, copy=True)

    def add_lens(self, layer: int, position: int, cell: LensCell) -> None:
        self.lens_cells.setdefault(layer, {})[position] = cell

    def add_features(self, position: int, cell: FeatureCell) -> None:
        self.feature_cells[position] = cell

    def features(self, tokens: list[str]) -> FeatureData:
        """What the SAE read at the positions recorded, for a sequence of `tokens`."""
        features = self.inside.features
        assert features is not None
        positions = sorted(self.feature_cells)
        cells = [self.feature_cells[p] for p in positions]
        missing: dict[str, str] = {}
        last = len(tokens) - 1
        if features.positions.selects(last, self.num_prompt) and last not in self.feature_cells:
            missing[f"position {last}"] = ("the last token is sampled, never run through the "
                                           "model: no position after it needs its activations")
        return FeatureData(
            tokens=tokens, sae=features.sae.name, hook_name=features.sae.hook_name,
            d_sae=features.sae.d_sae, positions=positions,
            top_ids=torch.stack([c.top_ids for c in cells]) if cells
            else torch.zeros(0, features.top_k, dtype=torch.long),
            top_values=torch.stack([c.top_values for c in cells]) if cells
            else torch.zeros(0, features.top_k),
            indices=list(features.indices),
            values=torch.stack([c.values for c in cells]) if cells
            else torch.zeros(0, len(features.indices)),
            l0=[c.l0 for c in cells], error_norm=[c.error_norm for c in cells], missing=missing)

    def activations(self, tokens: list[str]) -> ActivationData:
        """What the capture recorded, for a sequence of `tokens` (texts, prompt then
        generated)."""
        capture = self.inside.capture
        assert capture is not None
        computed = sorted({p for chunks in self.rows.values() for p in _positions(chunks)}
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
                spliced = capture.saes.get(name)  # (SAE, hook) for a name inside an SAE
                chunks = self.rows.get(spliced[0].hook_name if spliced else name)
                if chunks:
                    rows = _stack(chunks)  # [P, W]
                    if spliced:
                        out = spliced[0].hook_name_out
                        rows = _through_sae(*spliced, rows,
                                            _stack(self.rows[out]) if out else rows)
                        if capture.sparse and spliced[1] == "acts_post":
                            rows = rows.to_sparse()  # COO, coalesced: row-major
                    tensors[name] = _reduce(rows, capture.reduce)  # reduced where asked
                    continue
            missing[name] = "no position it asked for was computed"
        last = len(tokens) - 1
        if capture.positions.selects(last, self.num_prompt) and last not in computed:
            missing[f"position {last}"] = ("the last token is sampled, never run through the "
                                           "model: no position after it needs its activations")
        positions = sorted({p for chunks in self.rows.values() for p in _positions(chunks)}) or \
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


def _through_sae(sae: Any, hook: str, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """What SAELens's hook `hook` of the SAE spliced at a site holds, for the site's rows x
    [P, d_in] (float32) and the rows `out` of the hook it writes (x itself for an SAE; a
    transcoder's output hook's): the input, the pre-activations and features, the
    reconstruction (`decode`: a skip transcoder's W_skip is not in it, as in SAELens), the
    error (out - reconstruction) or the output (with the error term: out itself)."""
    if hook == "input":
        return x
    if hook == "output":
        return out
    if hook == "acts_pre":
        return sae.pre_activations(x)
    acts = sae.encode(x)
    if hook == "acts_post":
        return acts
    recons = sae.decode(acts, x)
    return recons if hook == "recons" else out - recons


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


def _positions(chunks: list[tuple[int, torch.Tensor]]) -> set[int]:
    return {p for first, rows in chunks for p in range(first, first + rows.shape[0])}


def _stack(chunks: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
    """The rows of every recorded position in order [P, W], a position's latest row where it
    came twice: the chunks as they are where they follow each other (a prompt's chunks, then
    one row a decode step), else row by row."""
    ends = [first + rows.shape[0] for first, rows in chunks]
    if all(chunks[i + 1][0] >= ends[i] for i in range(len(chunks) - 1)):
        return torch.cat([rows for _, rows in chunks])
    latest: dict[int, torch.Tensor] = {}
    for first, rows in chunks:
        for i, row in enumerate(rows.unbind(0)):
            latest[first + i] = row
    return torch.stack([latest[p] for p in sorted(latest)])
