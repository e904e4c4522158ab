"""What a finished request's capture and logit lens recorded, as plain data: what the engine
hands back (`RequestOutput.activations`, `.logit_lens`) and its HTTP form.

`ActivationData`: tensors by TransformerLens's full names (`[positions, d_model]`, `[d_model]`
when reduced, `[heads, queries, keys]` for a pattern) over absolute `positions`, what was asked
and is absent (`missing`), each pattern's heads. `LogitLensData`: per layer and position the
top-k token ids, probabilities and texts, and the tracked tokens' ranks and probabilities.
`to_wire()` / `from_wire()`: plain JSON, each tensor's exact bits (`workbench.inside.tensors`).
The views users hold (`ActivationCache`, `LogitLens`, in `workbench.inspect`) are these with
lookups, frames, plots and HTML; the facades build them (`workbench.inspect.activations.
with_views`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Self

import torch

from workbench.inside.tensors import decode_tensor, encode_tensor


@dataclass
class ActivationData:
    """A request's captured activations (see the module docstring)."""

    tokens: list[str]  # every token of the sequence, prompt then generated, as text
    num_layers: int  # of the model
    tensors: dict[str, torch.Tensor]  # TransformerLens name -> tensor
    positions: list[int]  # the absolute positions the rows are of
    reduce: str | None = None  # mean | last: one row per name, reduced over `positions`
    missing: dict[str, str] = field(default_factory=dict)  # asked, absent -> why
    pattern_heads: dict[int, list[int]] = field(default_factory=dict)  # layer -> heads kept

    @classmethod
    def of(cls, data: Any) -> Self:
        """The same fields as another `ActivationData` (a view of the engine's data)."""
        return cls(**{f.name: getattr(data, f.name) for f in fields(data)})

    def to_wire(self) -> dict[str, Any]:
        """The HTTP form: plain JSON, each tensor's exact bits (`workbench.inside.tensors`)."""
        return {"tokens": list(self.tokens), "num_layers": self.num_layers,
                "positions": list(self.positions), "reduce": self.reduce,
                "missing": dict(self.missing),
                "pattern_heads": {str(k): list(v) for k, v in self.pattern_heads.items()},
                "tensors": {name: encode_tensor(t) for name, t in self.tensors.items()}}

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> Self:
        """The data of a response choice's `activations`."""
        try:
            return cls(tokens=list(wire["tokens"]), num_layers=int(wire["num_layers"]),
                       tensors={k: decode_tensor(v) for k, v in wire["tensors"].items()},
                       positions=[int(p) for p in wire["positions"]], reduce=wire["reduce"],
                       missing=dict(wire.get("missing") or {}),
                       pattern_heads={int(k): list(v) for k, v in
                                      (wire.get("pattern_heads") or {}).items()})
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not an `activations` object: {error}") from error


@dataclass
class LogitLensData:
    """The logit lens of one request (see the module docstring)."""

    tokens: list[str]  # the sequence's tokens, prompt then generated
    layers: list[int]
    positions: list[int]
    top_ids: torch.Tensor  # [layers, positions, k] int64
    top_probs: torch.Tensor  # [layers, positions, k] float32
    top_tokens: list[list[list[str]]]  # [layers][positions][k] texts of top_ids
    token_ranks: dict[int, torch.Tensor] = field(default_factory=dict)  # id -> [layers, positions]
    token_probs: dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def of(cls, data: Any) -> Self:
        """The same fields as another `LogitLensData` (a view of the engine's data)."""
        return cls(**{f.name: getattr(data, f.name) for f in fields(data)})

    def to_wire(self) -> dict[str, Any]:
        """The HTTP form: plain JSON, the tensors' exact bits (`workbench.inside.tensors`)."""
        return {"tokens": list(self.tokens), "layers": list(self.layers),
                "positions": list(self.positions), "top_ids": encode_tensor(self.top_ids),
                "top_probs": encode_tensor(self.top_probs), "top_tokens": self.top_tokens,
                "token_ranks": {str(t): encode_tensor(v) for t, v in self.token_ranks.items()},
                "token_probs": {str(t): encode_tensor(v) for t, v in self.token_probs.items()}}

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> Self:
        """The data of a response choice's `logit_lens`."""
        try:
            return cls(tokens=list(wire["tokens"]), layers=[int(x) for x in wire["layers"]],
                       positions=[int(p) for p in wire["positions"]],
                       top_ids=decode_tensor(wire["top_ids"]),
                       top_probs=decode_tensor(wire["top_probs"]),
                       top_tokens=wire["top_tokens"],
                       token_ranks={int(t): decode_tensor(v)
                                    for t, v in (wire.get("token_ranks") or {}).items()},
                       token_probs={int(t): decode_tensor(v)
                                    for t, v in (wire.get("token_probs") or {}).items()})
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a `logit_lens` object: {error}") from error
