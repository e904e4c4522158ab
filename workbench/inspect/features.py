"""`FeatureActivations`: what an SAE read at each position of a request.

The request's `features` (`SamplingParams.features`: an SAE loaded by name, `top_k`, named
`indices`) gives per position its `top_k` most active features (`top_ids[p]`, `top_values[p]`,
largest first), the activations of the named features (`values[p]`, `activation(i)`), L0 (how
many features are active) and the norm of the reconstruction error.

`_repr_html_` shows the tokens, each coloured by a feature's activation (the one given to
`html(feature=...)`, else `strongest()`: the most active past the first token), its top features on
hover, with a table of each position's top features below; `to_frame()` one row per position and
rank; `plot()` a tokens-by-features heatmap of the features that are ever most active. It is the
engine's `FeatureData` (`workbench.inside.recorded`) as a view; `to_wire()` / `from_wire()`:
the HTTP form.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass
from typing import Any

import torch

from workbench.display import html as h
from workbench.display.figure import fading, neutral
from workbench.display.frames import frame
from workbench.inside.recorded import FeatureData

ORANGE = "#c2410c"  # the plot's cells: this at the activation's share of the most (`fading`)
MAX_TABLE_ROWS = 32  # positions in the notebook table (the last ones): `html(last=...)` for more
HOW_TO_READ = ("each token coloured by the feature's activation there (white: inactive); hover "
               "for the position's top features, its L0 and reconstruction error")


def activation_color(share: float) -> str:
    """A background for an activation at `share` of the most (0..1): white to orange, as hex."""
    share = min(max(share, 0.0), 1.0)
    r, g, b = colorsys.hls_to_rgb(25 / 360, 0.97 - 0.32 * share, 0.9)
    return "#" + "".join(f"{round(255 * c):02x}" for c in (r, g, b))


@dataclass
class FeatureActivations(FeatureData):
    """An SAE's features at a request's positions (see the module docstring)."""

    def top(self, position: int) -> list[tuple[int, float]]:
        """(feature, activation) of the most active features at absolute `position` (negative:
        from the last read), largest first; inactive ones left out."""
        p = self._row(position)
        return [(int(i), float(v)) for i, v in zip(self.top_ids[p].tolist(),
                                                     self.top_values[p].tolist()) if v > 0]

    def activation(self, feature: int) -> torch.Tensor:
        """[positions] activation of `feature`: a named one (`features.indices`) everywhere,
        else where it was among a position's top k (0 where it was not: at most its true
        value, so name it in `indices` to read it exactly)."""
        if feature in self.indices:
            return self.values[:, self.indices.index(feature)].clone()
        hits = (self.top_ids == feature).to(self.top_values.dtype)
        return (self.top_values * hits).sum(-1)

    def _row(self, position: int) -> int:
        return self.positions.index(position) if position >= 0 else len(self.positions) + position

    # -- data -------------------------------------------------------------------------------
    def to_frame(self) -> Any:
        """One row per position and rank among its top features: the token, the feature and
        its activation, the position's L0 and error norm; then a column per named feature."""
        records = []
        for p, position in enumerate(self.positions):
            named = {f"f_{i}": float(self.values[p, j]) for j, i in enumerate(self.indices)}
            ranks = list(zip(self.top_ids[p].tolist(), self.top_values[p].tolist())) or \
                [(None, None)]
            for k, (feature, value) in enumerate(ranks):
                records.append({"position": position, "token": self.tokens[position], "k": k,
                                "feature": feature, "activation": value, "l0": self.l0[p],
                                "error_norm": self.error_norm[p], **named})
        return frame(records, ["position", "token", "k", "feature", "activation", "l0",
                               "error_norm", *(f"f_{i}" for i in self.indices)])

    def to_dict(self) -> dict[str, Any]:
        """Inspectable's plain data: the wire form."""
        return self.to_wire()

    def strongest(self) -> int | None:
        """The feature with the largest activation in the request past its first token (whose
        activations, an attention sink's, dwarf the rest in most models), else at the first;
        None where none is active."""
        later = [i for i, p in enumerate(self.positions) if p > 0]
        for rows in (later, list(range(len(self.positions)))):
            values = self.top_values[rows]
            if values.numel() and float(values.max()) > 0:
                return int(self.top_ids[rows].flatten()[int(values.argmax())])
        return None

    # -- rendering --------------------------------------------------------------------------
    def html(self, feature: int | None = None, last: int = MAX_TABLE_ROWS) -> str:
        """The tokens coloured by `feature` (default: `strongest()`), and the table of the last
        `last` positions' top features."""
        feature = self.strongest() if feature is None else feature
        acts = self.activation(feature) if feature is not None else torch.zeros(
            len(self.positions))
        most = float(acts.max()) if acts.numel() and float(acts.max()) > 0 else 1.0
        by_position = dict(zip(self.positions, range(len(self.positions))))
        spans = []
        for position, token in enumerate(self.tokens):
            p = by_position.get(position)
            if p is None:
                spans.append(f'<span style="opacity:0.6">{h.token_html(token)}</span>')
                continue
            value = float(acts[p])
            title = (f"position {position}: {value:.3f}; top "
                     + ", ".join(f"{i}: {v:.2f}" for i, v in self.top(position)[:5])
                     + f"; L0 {self.l0[p]}, error {self.error_norm[p]:.3f}")
            style = h.on(activation_color(value / most)) if value > 0 else ""
            spans.append(f'<span style="{style};white-space:pre" '
                         f'title="{h.escape(title)}">{h.token_html(token)}</span>')
        rows = [(position, h.token_html(self.tokens[position]), self.l0[p],
                 h.fmt(self.error_norm[p], 3),
                 ", ".join(f"{i} ({v:.2f})" for i, v in self.top(position)) or "none active")
                for p, position in list(enumerate(self.positions))[-last:]]
        cut = (f" (the last {last} of {len(self.positions)} positions: .html(last=...))"
               if len(self.positions) > last else "")
        what = f"feature {feature}" if feature is not None else "no active feature"
        return h.themed(
            f'<div class="wb-features"><div style="font-size:12px">SAE '
            f"{h.escape(self.sae)} at {h.escape(self.hook_name)} ({self.d_sae} features): "
            f"{what}, {len(self.positions)} positions{h.escape(cut)}</div>"
            f"{h.caption(HOW_TO_READ)}"
            f'<div style="font-family:monospace;font-size:12px;line-height:1.7;margin:4px 0">'
            f"{''.join(spans)}</div>"
            + h.table(["position", "token", "L0", "error", "top features (activation)"],
                      [(r[0], r[1], r[2], h.escape(r[3]), h.escape(r[4])) for r in rows],
                      escape_cells=False)
            + "</div>")

    def _repr_html_(self) -> str:
        return self.html()

    def plot(self, ax: Any = None, last: int = 32, features: list[int] | None = None) -> Any:
        """The activations of `features` (default: each position's most active, at most 12)
        at the last `last` positions: features down, tokens across."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib

        cols = list(range(len(self.positions)))[-last:]
        if features is None:
            firsts = [int(self.top_ids[p, 0]) for p in cols
                      if self.top_ids.shape[1] and float(self.top_values[p, 0]) > 0]
            features = list(dict.fromkeys(firsts))[:12]
        grid = torch.stack([self.activation(f)[cols] for f in features]) if features \
            else torch.zeros(0, len(cols))
        if ax is None:
            _, ax = plt.subplots(figsize=(min(2 + 0.45 * len(cols), 16),
                                          1.2 + 0.32 * max(len(features), 1)))
        image = ax.imshow(grid.numpy(), cmap=fading(ORANGE), vmin=0.0, aspect="auto",
                          interpolation="nearest")
        ax.set_xticks(range(len(cols)), [h.visible(self.tokens[self.positions[c]])[:10]
                                         for c in cols], rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(features)), [str(f) for f in features], fontsize=7)
        ax.set_xlabel("token")
        ax.set_ylabel("feature")
        ax.set_title(f"{self.sae}: feature activations", fontsize=10)
        ax.figure.colorbar(image, ax=ax, label="activation")
        return neutral(ax)

    def __repr__(self) -> str:
        return (f"FeatureActivations(sae {self.sae!r} at {self.hook_name}, "
                f"{len(self.positions)} positions, top {self.top_ids.shape[-1]})")
