"""What a finished request's capture, logit lens and features recorded, as plain data: what the
engine hands back (`RequestOutput.activations`, `.logit_lens`, `.features`) and its HTTP form.

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
class FeatureData:
    """An SAE's features at a request's positions (`SamplingParams.features`): per position the
    `top_k` most active features (ids and activations, largest first), the activations of the
    named `indices`, L0 (how many features are active) and the norm of the reconstruction
    error (the hook's activation minus the SAE's reconstruction of it)."""

    tokens: list[str]  # the sequence's tokens, prompt then generated
    sae: str
    hook_name: str
    d_sae: int
    positions: list[int]
    top_ids: torch.Tensor  # [P, k] int64
    top_values: torch.Tensor  # [P, k] float32
    indices: list[int]
    values: torch.Tensor  # [P, len(indices)] float32
    l0: list[int]
    error_norm: list[float]
    missing: dict[str, str] = field(default_factory=dict)  # asked, absent -> why

    @classmethod
    def of(cls, data: Any) -> Self:
        """The same fields as another `FeatureData` (a view of the engine's data)."""
        return cls(**{f.name: getattr(data, f.name) for f in fields(data)})

    def to_wire(self) -> dict[str, Any]:
        """The HTTP form: plain JSON, the activations' exact bits (`workbench.inside.tensors`)."""
        return {"tokens": list(self.tokens), "sae": self.sae, "hook_name": self.hook_name,
                "d_sae": self.d_sae, "positions": list(self.positions),
                "top_ids": self.top_ids.tolist(), "top_values": encode_tensor(self.top_values),
                "indices": list(self.indices), "values": encode_tensor(self.values),
                "l0": list(self.l0), "error_norm": list(self.error_norm),
                "missing": dict(self.missing)}

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> Self:
        """The data of a response choice's `features`."""
        try:
            return cls(tokens=list(wire["tokens"]), sae=wire["sae"], hook_name=wire["hook_name"],
                       d_sae=int(wire["d_sae"]), positions=[int(p) for p in wire["positions"]],
                       top_ids=torch.tensor(wire["top_ids"], dtype=torch.long).reshape(
                           len(wire["positions"]), -1),
                       top_values=decode_tensor(wire["top_values"]),
                       indices=[int(i) for i in wire["indices"]],
                       values=decode_tensor(wire["values"]), l0=[int(v) for v in wire["l0"]],
                       error_norm=[float(v) for v in wire["error_norm"]],
                       missing=dict(wire.get("missing") or {}))
        except (KeyError, TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"not a `features` object: {error}") from error


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
