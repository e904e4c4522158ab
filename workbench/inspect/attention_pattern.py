"""`AttentionPattern`: one layer's attention probabilities, head by head.

`pattern[h, q, k]` is how much query `query_positions[q]` of head `heads[h]` attends to key
position `k` (TransformerLens's `blocks.{l}.attn.hook_pattern`, queries cut to the captured
positions; zero after each query's own position). `pattern_of(head)` is one head's
`[queries, keys]`, `to_frame()` one row per head, query and key it can see, `plot()` a grid of
heatmaps, and `_repr_html_` the same grid as small tables whose cells show the weight on hover.

The notebook view shows at most `MAX_HEADS` heads and the last `MAX_POSITIONS` queries and
keys (it says what it cut); `html(heads=..., last=...)` chooses others. A cell's colour is one
blue at the weight's opacity over the page, so it reads the same in light and dark themes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.display import html as h
from workbench.display.figure import fading, neutral
from workbench.display.frames import frame

MAX_HEADS = 8
MAX_POSITIONS = 24
HOW_TO_READ = ("a row is a query (its token on the left), a column a key; the darker the cell, "
               "the more weight; hover a cell for it")
CELL = 9  # pixels a side
BLUE = "#2563eb"  # a cell is this at alpha = its weight (16 steps), on either theme's page


@dataclass
class AttentionPattern:
    """A layer's attention probabilities (see the module docstring)."""

    layer: int
    heads: list[int]  # the model's head numbers, in the order of `pattern`'s first axis
    pattern: torch.Tensor  # [heads, queries, keys]
    query_positions: list[int]  # absolute positions of the queries
    tokens: list[str]  # the sequence's tokens; keys are positions 0 .. keys - 1

    def pattern_of(self, head: int) -> torch.Tensor:
        """Head `head` (the model's number)'s `[queries, keys]`."""
        if head not in self.heads:
            raise KeyError(f"head {head} was not captured at layer {self.layer}; "
                           f"captured: {self.heads}")
        return self.pattern[self.heads.index(head)]

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "heads": list(self.heads),
                "query_positions": list(self.query_positions), "tokens": list(self.tokens),
                "pattern": self.pattern.tolist()}

    def to_frame(self) -> Any:
        """One row per head, query and each key at or before it: the weight and both tokens."""
        records = [
            {"layer": self.layer, "head": head, "query": q, "query_token": self.tokens[q],
             "key": k, "key_token": self.tokens[k], "weight": float(w)}
            for hi, head in enumerate(self.heads)
            for qi, q in enumerate(self.query_positions)
            for k, w in enumerate(self.pattern[hi, qi, :q + 1].tolist())]
        return frame(records, ["layer", "head", "query", "query_token", "key", "key_token",
                               "weight"])

    def plot(self, heads: list[int] | None = None, ax: Any = None) -> Any:
        """A heatmap per head (`heads`: the model's numbers, default every captured one, at
        most 16), queries down and keys across, on `ax` (one head) or a new figure's grid;
        returns the first head's axes (the others are `ax.figure.axes`)."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib
        import numpy as np

        chosen = (heads or self.heads)[:16]
        if ax is not None and len(chosen) > 1:
            raise ValueError("one axes draws one head: pass heads=[h] with ax, or no ax")
        if ax is None:
            cols = min(len(chosen), 4)
            rows = -(-len(chosen) // cols)
            _, ax = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
        axes = np.atleast_1d(ax).ravel()
        keys = self.pattern.shape[-1]
        for a, head in zip(axes, chosen):
            a.imshow(self.pattern_of(head).numpy(), cmap=fading(BLUE), vmin=0.0, vmax=1.0,
                     aspect="auto", interpolation="nearest")
            a.set_title(f"L{self.layer}H{head}", fontsize=9)
            if keys <= 32:
                a.set_xticks(range(keys), [h.visible(t)[:8] for t in self.tokens[:keys]],
                             rotation=90, fontsize=6)
                a.set_yticks(range(len(self.query_positions)),
                             [h.visible(self.tokens[q])[:8] for q in self.query_positions],
                             fontsize=6)
            neutral(a)
        for a in axes[len(chosen):]:
            a.set_axis_off()
        return axes[0]

    def html(self, heads: list[int] | None = None, last: int = MAX_POSITIONS) -> str:
        """The head grid for `heads` (the model's numbers; default the first `MAX_HEADS`)
        over the last `last` queries and keys."""
        chosen = heads if heads is not None else self.heads[:MAX_HEADS]
        queries = list(enumerate(self.query_positions))[-last:]
        keys = self.pattern.shape[-1]
        first_key = max(0, keys - last)
        grids = "".join(self._grid(head, queries, first_key, keys) for head in chosen)
        cut = []
        if len(chosen) < len(self.heads):
            cut.append(f"{len(chosen)} of {len(self.heads)} heads")
        if len(queries) < len(self.query_positions) or first_key:
            cut.append(f"the last {last} queries and keys")
        shown = f" (showing {', '.join(cut)}: .html(heads=..., last=...))" if cut else ""
        return (f'<div class="wb-pattern"><div style="font-size:12px">Attention pattern, '
                f"layer {self.layer}, {len(self.heads)} heads × {len(self.query_positions)} "
                f"queries × {keys} keys{h.escape(shown)}</div>"
                f"{h.caption(HOW_TO_READ)}"
                f'<div style="display:flex;flex-wrap:wrap;gap:10px">{grids}</div></div>')

    def _grid(self, head: int, queries: list[tuple[int, int]], first_key: int,
              keys: int) -> str:
        """One head as a CSS grid of `CELL`-pixel squares (not a table: JupyterLab pads and
        stripes table cells), each query's token on the left."""
        weights = self.pattern_of(head)
        cells = []
        for qi, q in queries:
            label = h.escape(h.visible(self.tokens[q])[:10])
            cells.append(f'<span style="font-size:9px;line-height:{CELL}px;text-align:right;'
                         f'padding-right:4px;white-space:pre">{label}</span>')
            for k in range(first_key, keys):
                if k > q:  # after the query: masked
                    cells.append("<span></span>")
                    continue
                w = float(weights[qi, k])
                alpha = round(min(max(w, 0.0), 1.0) * 15) * 17  # 16 steps: 0x00 .. 0xff
                title = (f"H{head} {h.visible(self.tokens[q])!r} → "
                         f"{h.visible(self.tokens[k])!r}: {w:.3f}")
                cells.append(f'<span style="background-color:{BLUE}{alpha:02x}" '
                             f'title="{h.escape(title)}"></span>')
        columns = f"auto repeat({keys - first_key},{CELL}px)"
        return (f'<div><div style="font-size:11px">head {head}</div>'
                f'<div style="display:grid;grid-template-columns:{columns};'
                f'grid-auto-rows:{CELL}px;border:1px solid var(--jp-border-color2,#cccccc)">'
                f'{"".join(cells)}</div></div>')

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        return (f"AttentionPattern(layer {self.layer}, heads {self.heads}, "
                f"{len(self.query_positions)} queries x {self.pattern.shape[-1]} keys)")
