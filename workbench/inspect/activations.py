"""`ActivationCache`: what a request's `capture` recorded, by TransformerLens's names.

Dict-like as TransformerLens's `ActivationCache`: `cache["blocks.3.hook_resid_post"]`, the
shorthand `cache["resid_post", 3]` (a negative layer counts from the last), `cache["normalized"]`
(`ln_final.hook_normalized`) and `cache["pattern", 1]`; iterating gives the names. A residual
site's tensor is `[positions, d_model]` over `positions` (absolute positions of the sequence,
prompt then generated), or `[d_model]` when the capture reduced them (`reduce`: mean, last); a
pattern is `[heads, queries, keys]`, zero after each query's own position. Float32 whatever the
model ran in. An SAE's features captured with `sparse` are sparse COO tensors
(`.to_dense()`, `.indices()`, `.values()`).

What was asked and is absent is stated in `missing` (name or position -> why) and a lookup of
it raises a KeyError with the reason: the last sampled token is never run through the model,
so it has no activations. `stack(site)` is `[layers, ...]` (TransformerLens's
`stack_activation`), `pattern(layer)` an `AttentionPattern`, `to_frame()` one row per name and
position, `plot()` the residual stream's norm by layer and position, `to_wire()` / `from_wire()`
the HTTP form (`workbench.inside.tensors`: exact bits).

It is the engine's `ActivationData` (`workbench.inside.recorded`) as a view: the facades turn
the data of an output into it (`with_views`, as `LLM` hands outputs over); a response's
`activations` decode into it (`ActivationCache.from_wire`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from workbench.display import html as h
from workbench.display.figure import neutral
from workbench.display.frames import frame
from workbench.inside.recorded import ActivationData
from workbench.inside.sites import CAPTURE_SITES, site_name
from workbench.inspect.attention_pattern import AttentionPattern
from workbench.inspect.features import FeatureActivations
from workbench.inspect.logit_lens import LogitLens


@dataclass
class ActivationCache(ActivationData):
    """A request's captured activations (see the module docstring): `ActivationData`'s
    fields, `to_wire()` and `from_wire()`, with lookups and drawings."""

    # -- access -----------------------------------------------------------------------------
    def name(self, key: Any) -> str:
        """The full name of a key: a name, a short site with a layer (`("resid_post", -1)`), or
        `"normalized"`."""
        if isinstance(key, str) and key in self.tensors:
            return key
        site, layer = key if isinstance(key, tuple) and len(key) == 2 else (key, None)
        if not isinstance(site, str):
            raise KeyError(f"{key!r}: a key is a name such as 'blocks.0.hook_resid_post' or "
                           "(site, layer) such as ('resid_post', 0)")
        short = site.removeprefix("hook_").removeprefix("attn.hook_")
        if short in ("normalized", "ln_final", "ln_final.hook_normalized"):
            return site_name("normalized", None)
        if short not in CAPTURE_SITES:
            return site  # a full name not captured: the lookup says so
        if layer is None:
            raise KeyError(f"{site!r} needs a layer: cache[{site!r}, 0] or cache[{site!r}, -1]")
        if not -self.num_layers <= layer < self.num_layers:
            raise KeyError(f"layer {layer} is outside the model's {self.num_layers} layers")
        return site_name(short, layer % self.num_layers)

    def __getitem__(self, key: Any) -> torch.Tensor:
        name = self.name(key)
        if name in self.tensors:
            return self.tensors[name]
        if name in self.missing:
            raise KeyError(f"{name} was asked for but is absent: {self.missing[name]}")
        raise KeyError(f"{name} was not captured; this cache holds "
                       f"{', '.join(self.tensors) or 'nothing'}")

    def __contains__(self, key: Any) -> bool:
        try:
            return self.name(key) in self.tensors
        except KeyError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def keys(self) -> list[str]:
        return list(self.tensors)

    def items(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.tensors.items())

    def layers_of(self, site: str) -> list[int]:
        """The layers captured at a short site (`resid_post`, `pattern`, ...), in order."""
        return [layer for layer in range(self.num_layers)
                if site_name(site, layer) in self.tensors]

    def stack(self, site: str = "resid_post", layers: list[int] | None = None) -> torch.Tensor:
        """`[layers, ...]`: the site at each layer (all captured ones when `layers` is None)."""
        chosen = self.layers_of(site) if layers is None else layers
        if not chosen:
            raise KeyError(f"no layer of {site!r} was captured")
        return torch.stack([self[site, layer] for layer in chosen])

    stack_activation = stack  # TransformerLens's name

    def pattern(self, layer: int) -> AttentionPattern:
        """Layer `layer`'s attention pattern as a view (heads, queries, keys, tokens)."""
        name = self.name(("pattern", layer))
        values = self[name]
        layer = int(name.split(".")[1])
        heads = self.pattern_heads.get(layer, list(range(values.shape[0])))
        return AttentionPattern(layer, heads, values, list(self.positions), list(self.tokens))

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(t) for t in self.tensors.values())

    # -- data -------------------------------------------------------------------------------
    def to_frame(self) -> Any:
        """One row per residual name and position (per name when reduced): layer, site, the
        token, and the row's L2 norm, mean and largest magnitude. Patterns: `pattern(l)`."""
        records = []
        for name, tensor in self.tensors.items():
            if name.endswith("hook_pattern"):
                continue
            rows = _dense(tensor).reshape(-1, tensor.shape[-1])
            labels = [None] if self.reduce else self.positions
            layer = None if name.startswith("ln_final") else int(name.split(".")[1])
            for position, row in zip(labels, rows):
                records.append({
                    "name": name, "layer": layer, "site": name.rsplit("hook_", 1)[1],
                    "position": position, "reduce": self.reduce,
                    "token": None if position is None else self.tokens[position],
                    "norm": row.norm().item(), "mean": row.mean().item(),
                    "max_abs": row.abs().max().item()})
        return frame(records, ["name", "layer", "site", "position", "reduce", "token", "norm",
                               "mean", "max_abs"], {"layer": "Int64", "position": "Int64"})

    def to_dict(self) -> dict[str, Any]:
        """Inspectable's plain data: the wire form."""
        return self.to_wire()

    # -- rendering --------------------------------------------------------------------------
    def plot(self, site: str = "resid_post", ax: Any = None) -> Any:
        """The L2 norm of `site` at each captured layer (rows) and position (columns), a
        heatmap; reduced captures are one column. Returns the axes."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib

        stacked = self.stack(site)
        norms = stacked.norm(dim=-1).reshape(stacked.shape[0], -1).numpy()
        layers = self.layers_of(site)
        if ax is None:
            _, ax = plt.subplots(figsize=(min(1.5 + 0.45 * norms.shape[1], 14),
                                          1.2 + 0.32 * len(layers)))
        image = ax.imshow(norms, aspect="auto", cmap="viridis", origin="lower")
        labels = [self.reduce] if self.reduce else [
            f"{p}:{h.visible(self.tokens[p])[:10]}" for p in self.positions]
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(layers)), [str(layer) for layer in layers], fontsize=7)
        ax.set_xlabel("position: token")
        ax.set_ylabel("layer")
        ax.set_title(f"‖{site}‖ by layer and position", fontsize=10)
        ax.figure.colorbar(image, ax=ax, label="L2 norm")
        return neutral(ax)

    def _repr_html_(self) -> str:
        rows = []
        for name, tensor in list(self.tensors.items())[:MAX_ROWS]:
            if name.endswith("hook_pattern"):
                summary = "attention probabilities: cache.pattern(layer)"
            else:
                norm = _dense(tensor).reshape(-1, tensor.shape[-1]).norm(dim=-1).mean().item()
                summary = f"mean ‖row‖ {h.fmt(norm, 3)}"
                if tensor.is_sparse:
                    summary += f", sparse: {tensor.coalesce().values().numel()} active"
            rows.append((name, "×".join(map(str, tensor.shape)), summary))
        more = len(self.tensors) - MAX_ROWS
        spans = _spans(self.positions)
        where = f"positions {spans}" + (f", reduced by {self.reduce}" if self.reduce else "")
        absent = "".join(f"<li>{h.escape(k)}: {h.escape(v)}</li>" for k, v in self.missing.items())
        return h.themed(
            f'<div class="wb-activations"><div style="font-size:12px">ActivationCache: '
            f"{len(self.tensors)} tensor{'s' if len(self.tensors) != 1 else ''}, {where}, "
            "float32, "
            f"{self.nbytes / 1e6:.2f} MB</div>"
            f"{h.caption(h.token_strip(self.tokens[p] for p in self.positions[:MAX_TOKENS]))}"
            f"{h.table(['name', 'shape', 'summary'], rows)}"
            + (h.caption(f"… and {more} more (iterate the cache for every name)") if more > 0
               else "")
            + (f'<div style="font-size:11px;color:{h.MUTED}">absent:<ul style="margin:0">'
               f"{absent}</ul></div>" if absent else "") + "</div>")

    def __repr__(self) -> str:
        count = f"{len(self.tensors)} tensor{'s' if len(self.tensors) != 1 else ''}"
        return (f"ActivationCache({count}, positions "
                f"{_spans(self.positions)}, reduce={self.reduce!r}, "
                f"{len(self.missing)} absent)")


MAX_ROWS = 40  # names listed in the notebook view


def _dense(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_dense() if tensor.is_sparse else tensor


def _nbytes(tensor: torch.Tensor) -> int:
    if tensor.is_sparse:
        tensor = tensor.coalesce()
        return _nbytes(tensor.indices()) + _nbytes(tensor.values())
    return tensor.numel() * tensor.element_size()
MAX_TOKENS = 64  # tokens shown above it


def _spans(positions: list[int]) -> str:
    """`0–9, 12` for [0..9, 12]."""
    spans: list[str] = []
    start = prev = None
    for p in [*positions, None]:
        if p is not None and prev is not None and p == prev + 1:
            prev = p
            continue
        if start is not None:
            spans.append(str(start) if start == prev else f"{start}–{prev}")
        start = prev = p
    return ", ".join(spans) or "none"


def with_views(output: Any) -> Any:
    """An engine output with its `activations`, `logit_lens` and `features` data as their views
    (`ActivationCache`, `LogitLens`, `FeatureActivations`): what the facades hand to users.
    Anything else as it is."""
    data = getattr(output, "activations", None)
    if isinstance(data, ActivationData) and not isinstance(data, ActivationCache):
        output.activations = ActivationCache.of(data)
    lens = getattr(output, "logit_lens", None)
    if lens is not None and not isinstance(lens, LogitLens):
        output.logit_lens = LogitLens.of(lens)
    features = getattr(output, "features", None)
    if features is not None and not isinstance(features, FeatureActivations):
        output.features = FeatureActivations.of(features)
    return output
