"""`LogitLens`: what the model would say after each layer, at each position.

The residual stream after block `l` (`blocks.{l}.hook_resid_post`) through the final norm and
the unembedding, a softmax over the whole vocabulary: `top_ids[l, p]` / `top_probs[l, p]` /
`top_tokens[l][p]` are its `top_k` tokens at position `positions[p]` (of `layers[l]`), and for
each token id the request tracked, `rank(id)[l, p]` (0: the most likely) and `prob(id)[l, p]`
over the full distribution. At the last layer it is the model's own next-token distribution.

`_repr_html_` is the classic table (layers down, positions across, each cell the top token,
coloured by its probability, its top-k on hover), `to_frame()` one row per layer, position and
rank, `plot()` the top-1 probability as a heatmap labelled with its tokens, `plot_rank(id)` a
token's rank through the layers. `to_wire()` / `from_wire()`: the HTTP form. It is the
engine's `LogitLensData` (`workbench.inside.recorded`) as a view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.display import html as h
from workbench.display.figure import GREY, fading, neutral
from workbench.display.frames import frame
from workbench.inside.recorded import LogitLensData

HOW_TO_READ = ("row: the layer after which the stream is unembedded (the last on top); column: "
               "the input token; cell: the next token it predicts; hover for the top k")
MAX_POSITIONS = 16  # columns of the notebook table (the last ones); `html(last=...)` for more
GREEN = "#15803d"  # the plot's cells: this at the top-1 probability's opacity (`figure.fading`)


@dataclass
class LogitLens(LogitLensData):
    """The logit lens of one request (see the module docstring): `LogitLensData`'s fields,
    `to_wire()` and `from_wire()`, with lookups and drawings."""

    def rank(self, token_id: int) -> torch.Tensor:
        """`[layers, positions]` rank of a tracked token (0: the most likely)."""
        return self._tracked(self.token_ranks, token_id)

    def prob(self, token_id: int) -> torch.Tensor:
        """`[layers, positions]` probability of a tracked token."""
        return self._tracked(self.token_probs, token_id)

    def _tracked(self, table: dict[int, torch.Tensor], token_id: int) -> torch.Tensor:
        if token_id not in table:
            raise KeyError(f"token id {token_id} was not tracked; ask for it in "
                           f"logit_lens.token_ids (tracked: {sorted(table)})")
        return table[token_id]

    def top(self, layer: int, position: int) -> list[tuple[str, float]]:
        """The top tokens and probabilities after `layer` at absolute `position` (a negative
        layer or position counts from the last captured one)."""
        li = self.layers.index(layer) if layer >= 0 else len(self.layers) + layer
        pi = self.positions.index(position) if position >= 0 else len(self.positions) + position
        return list(zip(self.top_tokens[li][pi], self.top_probs[li, pi].tolist()))

    # -- data -------------------------------------------------------------------------------
    def to_frame(self) -> Any:
        """One row per layer, position and rank: the input token there, the top token and its
        probability; then a column per tracked token id: its rank there (`rank_<id>`)."""
        records = []
        for li, layer in enumerate(self.layers):
            for pi, position in enumerate(self.positions):
                tracked = {f"rank_{t}": int(r[li, pi]) for t, r in self.token_ranks.items()}
                for k, (tid, p) in enumerate(zip(self.top_ids[li, pi].tolist(),
                                                 self.top_probs[li, pi].tolist())):
                    records.append({"layer": layer, "position": position,
                                    "token": self.tokens[position], "k": k, "top_id": tid,
                                    "top_token": self.top_tokens[li][pi][k], "prob": p,
                                    **tracked})
        columns = ["layer", "position", "token", "k", "top_id", "top_token", "prob",
                   *(f"rank_{t}" for t in self.token_ranks)]
        return frame(records, columns)

    def to_dict(self) -> dict[str, Any]:
        """Inspectable's plain data: the wire form."""
        return self.to_wire()

    # -- rendering --------------------------------------------------------------------------
    def plot(self, ax: Any = None, last: int = 24) -> Any:
        """The top token's probability after each layer (rows, the last layer on top) at the
        last `last` positions (columns), each cell labelled with that token."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib
        from matplotlib.patheffects import withStroke

        cols = list(range(len(self.positions)))[-last:]
        probs = self.top_probs[:, cols, 0].numpy() if self.layers else [[]]
        if ax is None:
            _, ax = plt.subplots(figsize=(min(2 + 0.8 * len(cols), 16),
                                          1.2 + 0.35 * len(self.layers)))
        image = ax.imshow(probs, cmap=fading(GREEN), vmin=0.0, vmax=1.0, aspect="auto",
                          origin="lower", interpolation="nearest")
        for li in range(len(self.layers)):
            for ci, pi in enumerate(cols):
                # a cell shows the page as much as p is low: grey text there (both pages),
                # white outlined in the cells' green where the green dominates
                strong = float(self.top_probs[li, pi, 0]) > 0.6
                ax.text(ci, li, h.visible(self.top_tokens[li][pi][0])[:8], ha="center",
                        va="center", fontsize=6, color="white" if strong else GREY,
                        path_effects=[withStroke(linewidth=1.5, foreground=GREEN)] if strong
                        else None)
        ax.set_xticks(range(len(cols)), [h.visible(self.tokens[self.positions[c]])[:10]
                                         for c in cols], rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(self.layers)), [str(x) for x in self.layers], fontsize=7)
        ax.set_xlabel("input token (the lens predicts the next)")
        ax.set_ylabel("layer")
        ax.set_title("logit lens: top token after each layer", fontsize=10)
        ax.figure.colorbar(image, ax=ax, label="top-1 probability")
        return neutral(ax)

    def plot_rank(self, token_id: int, position: int = -1, ax: Any = None,
                  label: str | None = None) -> Any:
        """A tracked token's rank after each layer at `position` (absolute; -1: the last
        captured), on a log scale (rank 0 drawn at 1)."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib

        pi = self.positions.index(position) if position >= 0 else len(self.positions) + position
        ranks = self.rank(token_id)[:, pi].tolist()
        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3))
        ax.plot(self.layers, [r + 1 for r in ranks], marker="o",
                label=label or f"token {token_id}")
        ax.set_yscale("log")
        ax.invert_yaxis()
        ax.set_xlabel("layer")
        ax.set_ylabel("rank + 1 (1: the top token)")
        ax.set_title(f"rank at position {self.positions[pi]} "
                     f"({h.visible(self.tokens[self.positions[pi]])!r})", fontsize=10)
        ax.legend(fontsize=8)
        return neutral(ax)

    def html(self, last: int = MAX_POSITIONS) -> str:
        """The table over the last `last` positions."""
        cols = list(range(len(self.positions)))[-last:]
        head = "".join(f'<th style="padding:1px 4px;font-weight:normal">'
                       f'{h.token_html(self.tokens[self.positions[c]])}</th>' for c in cols)
        body = []
        for li in reversed(range(len(self.layers))):  # the last layer on top, as in the plot
            cells = []
            for c in cols:
                p = float(self.top_probs[li, c, 0])
                title = ", ".join(f"{t!r} {q:.3f}" for t, q in
                                  zip(self.top_tokens[li][c], self.top_probs[li, c].tolist()))
                cells.append(f'<td style="{h.on(h.prob_color(p))};padding:1px 4px;'
                             f'white-space:pre" title="{h.escape(title)}">'
                             f"{h.escape(h.visible(self.top_tokens[li][c][0])[:12])}</td>")
            body.append(f'<tr><th style="padding:1px 6px;font-weight:normal">'
                        f"{self.layers[li]}</th>{''.join(cells)}</tr>")
        cut = (f" (the last {len(cols)} of {len(self.positions)} positions: .html(last=...))"
               if len(cols) < len(self.positions) else "")
        tracked = f", tracking token ids {sorted(self.token_ranks)}" if self.token_ranks else ""
        return h.themed(
            f'<div class="wb-logit-lens"><div style="font-size:12px">Logit lens: '
            f"{len(self.layers)} layers × {len(self.positions)} positions, top "
            f"{self.top_ids.shape[-1] if self.top_ids.dim() == 3 else 0}{tracked}"
            f"{h.escape(cut)}</div>"
            f"{h.caption(HOW_TO_READ)}"
            f"{h.prob_legend()}"
            f'<table style="border-collapse:collapse;font-size:12px"><thead><tr>'
            f'<th style="font-weight:normal;padding:1px 6px">layer</th>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        return (f"LogitLens(layers {self.layers}, {len(self.positions)} positions, tracked "
                f"{sorted(self.token_ranks)})")
