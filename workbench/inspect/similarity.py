"""`SimilarityMatrix`: scores between row texts and column texts, as a table and a heatmap.

Every view colours a value the same way, whatever the kind: cosines, `/score` scores and
`/rerank` relevances on one scale from 0 to 1 (`prob_color`; a value outside it, a negative
cosine, takes the nearer end), stated in the table's legend and the plot's colorbar.

Built from embeddings (cosine of every row with every column), from a `/score` response (one
query against many documents, or N:N pairs) or from a `/rerank` response (the query against
its documents, in document order). Plain data: `rows`, `cols`, `values[i][j]`; `frame()` is a
pandas DataFrame, `best(row)` the best column, `_repr_html_` a deterministic coloured table,
`plot()` a matplotlib heatmap.

>>> m = SimilarityMatrix(["q"], ["a", "b"], [[0.25, 0.75]])
>>> m.best("q"), m["q", "b"]
('b', 0.75)
"""

from __future__ import annotations

import base64
import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.display import html as h
from workbench.display.figure import neutral


@dataclass
class SimilarityMatrix:
    """Scores of row texts against column texts (see the module docstring)."""

    rows: list[str]
    cols: list[str]
    values: list[list[float]]
    kind: str = "cosine"  # cosine | score | relevance
    vmin: float | None = field(default=None)  # colour scale; None: SCALE's end
    vmax: float | None = field(default=None)

    def __post_init__(self) -> None:
        if len(self.values) != len(self.rows) or any(len(r) != len(self.cols) for r in self.values):
            raise ValueError(f"values must be {len(self.rows)} rows of {len(self.cols)} columns")

    # -- builders ---------------------------------------------------------------------------
    @classmethod
    def from_embeddings(cls, embeddings: Any, labels: list[str],
                        col_embeddings: Any = None, col_labels: list[str] | None = None
                        ) -> "SimilarityMatrix":
        """Cosine similarity of every row embedding with every column embedding (rows
        against themselves when no columns are given)."""
        a = _unit(np.asarray(embeddings, dtype="float64"))
        b = a if col_embeddings is None else _unit(np.asarray(col_embeddings, dtype="float64"))
        values = (a @ b.T).tolist()
        return cls(list(labels), list(labels if col_labels is None else col_labels), values,
                   "cosine")

    @classmethod
    def from_embedding_response(cls, response: dict[str, Any], labels: list[str]
                                ) -> "SimilarityMatrix":
        """From a `/v1/embeddings` body (float or base64 embeddings)."""
        return cls.from_embeddings([_vector(d["embedding"]) for d in response["data"]], labels)

    @classmethod
    def from_score_response(cls, response: dict[str, Any], queries: list[str],
                            documents: list[str]) -> "SimilarityMatrix":
        """From a `/score` body: one query -> a row over the documents; N:N -> one row per pair."""
        scores = [d["score"] for d in sorted(response["data"], key=lambda d: d["index"])]
        if len(queries) == 1:
            return cls(list(queries), list(documents), [scores], "score")
        return cls([f"{q} | {d}" for q, d in zip(queries, documents)], ["score"],
                   [[s] for s in scores], "score")

    @classmethod
    def from_rerank_response(cls, response: dict[str, Any], query: str, documents: list[str]
                             ) -> "SimilarityMatrix":
        """From a `/rerank` body: the query's relevance to each returned document, in document
        order (documents cut by `top_n` are left out)."""
        results = sorted(response["results"], key=lambda r: r["index"])
        return cls([query], [documents[r["index"]] for r in results],
                   [[r["relevance_score"] for r in results]], "relevance")

    # -- access -----------------------------------------------------------------------------
    def __getitem__(self, key: tuple[Any, Any]) -> float:
        row, col = key
        i = self.rows.index(row) if isinstance(row, str) else row
        j = self.cols.index(col) if isinstance(col, str) else col
        return self.values[i][j]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.rows), len(self.cols)

    def best(self, row: Any = 0, exclude_self: bool = True) -> str:
        """The column scoring highest for `row` (its own text skipped when `exclude_self`)."""
        i = self.rows.index(row) if isinstance(row, str) else row
        candidates = [j for j in range(len(self.cols))
                      if not (exclude_self and self.cols[j] == self.rows[i])] or [0]
        return self.cols[max(candidates, key=lambda j: self.values[i][j])]

    def to_dict(self) -> dict[str, Any]:
        return {"rows": list(self.rows), "cols": list(self.cols), "kind": self.kind,
                "values": [list(r) for r in self.values]}

    def to_frame(self) -> Any:
        import pandas as pd  # optional: deferred, only frames need pandas

        return pd.DataFrame(self.values, index=self.rows, columns=self.cols)

    frame = to_frame  # the earlier name

    # -- rendering --------------------------------------------------------------------------
    def _scale(self) -> tuple[float, float]:
        lo = SCALE[0] if self.vmin is None else self.vmin
        hi = SCALE[1] if self.vmax is None else self.vmax
        return lo, (hi if hi > lo else lo + 1.0)

    def _legend(self) -> str:
        lo, hi = self._scale()
        chips = [(h.fmt(lo + f * (hi - lo), 2), h.prob_color(f)) for f in (0.0, 0.25, 0.5, 0.75, 1.0)]
        return h.swatches(chips, f"{self.kind}, the colours of every similarity view "
                                 f"(below {h.fmt(lo, 2)} as {h.fmt(lo, 2)}):")

    def _repr_html_(self) -> str:
        lo, hi = self._scale()
        head = "".join(f'<th style="{HEADER}">{h.clip_words(c, 60)}</th>' for c in self.cols)
        body = ""
        for label, row in zip(self.rows, self.values):
            cells = "".join(
                f'<td style="padding:2px 6px;text-align:right;color:{h.INK};background:'
                f'{h.prob_color((v - lo) / (hi - lo))}" title="{h.escape(c)}">{h.fmt(v)}</td>'
                for c, v in zip(self.cols, row))
            body += f'<tr><th style="{HEADER}">{h.clip_words(label, 60)}</th>{cells}</tr>'
        ident = h.content_id("wb-sim", self.rows, self.cols, self.values)
        legend = self._legend()
        return h.themed(f'<div id="{ident}" class="wb-similarity"><div style="font-size:12px">'
                f"{h.escape(self.kind)} similarity, {len(self.rows)}×{len(self.cols)}</div>"
                f"{h.caption('hover a cell or a cut label for its full text')}{legend}"
                f'<table style="border-collapse:collapse;font-size:12px"><thead><tr><th></th>'
                f"{head}</tr></thead><tbody>{body}</tbody></table></div>")

    def plot(self, ax: Any = None, cmap: Any = None, annotate: bool = True) -> Any:
        """A heatmap of the values (matplotlib) in the table's colours (`cmap` None) on the
        same scale; returns the axes."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib
        from matplotlib.colors import ListedColormap

        if ax is None:
            _, ax = plt.subplots(figsize=(1.2 + 1.1 * len(self.cols), 0.8 + 0.5 * len(self.rows)))
        lo, hi = self._scale()
        if cmap is None:
            cmap = ListedColormap([h.prob_color(i / 100) for i in range(101)])
        image = ax.imshow(self.values, cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
        ax.set_xticks(range(len(self.cols)), [_wrap(c) for c in self.cols], rotation=30,
                      ha="right", fontsize=8)
        ax.set_yticks(range(len(self.rows)), [_wrap(r) for r in self.rows], fontsize=8)
        ax.set_title(f"{self.kind} similarity", fontsize=10)
        ax.set_xlabel("columns")
        ax.set_ylabel("rows")
        if annotate:
            for i, row in enumerate(self.values):
                for j, v in enumerate(row):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8,
                            color=h.INK)
        ax.figure.colorbar(image, ax=ax, label=f"{self.kind} (below {lo:g} as {lo:g})")
        return neutral(ax)

    def __repr__(self) -> str:
        return f"SimilarityMatrix({self.kind}, {len(self.rows)}x{len(self.cols)})"


SCALE = (0.0, 1.0)  # the colour scale of every kind (see the module docstring)
# a header wraps at spaces (a long text cut at a word by `clip_words`, whole on hover)
HEADER = "padding:2px 6px;text-align:left;vertical-align:bottom;max-width:12em;white-space:normal"


def _unit(x: Any) -> Any:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms == 0, 1.0, norms)


def _vector(embedding: Any) -> list[float]:
    """A float list, or a base64 float32 string decoded as OpenAI's client does."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="float32").tolist()
    return list(embedding)


def _wrap(text: str, width: int = 24, lines: int = 3) -> str:
    """A tick label: wrapped at `width` characters, at most `lines` lines (then an ellipsis
    after the last whole word that fits)."""
    wrapped = textwrap.wrap(text, width) or [""]
    if len(wrapped) > lines:
        last = wrapped[lines - 1]
        words = last.rsplit(" ", 1)[0] if len(last) >= width and " " in last else last
        wrapped = wrapped[:lines - 1] + [words + "…"]
    return "\n".join(wrapped)
