"""`LogprobViewer`: a position slider over a `LogprobTable`, showing that position's top-k.

The text is drawn once with the selected token outlined; below it, the chosen token's logprob,
rank and entropy, and a table of the alternatives the source returned, each with a probability
bar. All HTML comes from `render_position`, a pure function, which is also the fallback.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from workbench.display import html as h
from workbench.inspect.logprob_table import LogprobTable


def render_position(table: LogprobTable, position: int) -> str:
    """The text with `position` outlined, then its alternatives (deterministic HTML)."""
    if not len(table):
        return '<div style="font-family:monospace">no generated positions</div>'
    row = table[position]
    spans = []
    for r in table:
        outline = "outline:2px solid #d62728;" if r.position == row.position else ""
        spans.append(f'<span title="{h.escape(repr(r.token))}" style="{h.on(h.prob_color(r.prob))};'
                     f'{outline}padding:1px 0;margin:0 1px;white-space:pre">'
                     f"{h.escape(h.visible(r.token))}</span>")
    alternatives = [
        (a.rank if a.rank is not None else "—",
         f"<b>{h.token_html(a.token)}</b>" if a.token == row.token else h.token_html(a.token),
         h.fmt(a.logprob), h.fmt(a.prob),
         f'<span style="display:inline-block;height:8px;width:{round(120 * a.prob)}px;'
         f'background:{h.prob_color(a.prob)}"></span>')
        for a in row.top]
    rank = row.rank if row.rank is not None else "—"
    summary = (f"position {row.position} of {len(table)}: {h.token_text(repr(row.token))} "
               f"logprob {h.fmt(row.logprob)}, rank {rank}, top-k entropy {h.fmt(row.entropy)} "
               f"(over the returned alternatives, renormalised), top-k mass "
               f"{h.fmt(row.top_mass)}")
    return h.themed(
        f'<div class="wb-logprob-position" style="font-family:monospace;line-height:1.9">'
        f'{h.prob_legend([("selected", "outline:2px solid #d62728")])}'
        f'<div>{"".join(spans)}</div><div class="wb-summary">{summary}</div>'
        f'{h.table(["rank", "token", "logprob", "prob", ""], alternatives, escape_cells=False)}'
        f"</div>")


class LogprobViewer(widgets.VBox):
    """A slider over positions; the HTML below shows the selected position's alternatives.

    >>> from workbench.inspect.logprob_table import Alternative, LogprobRow
    >>> table = LogprobTable((LogprobRow(0, "Hi", -0.1, 1, None, (Alternative("Hi", -0.1, 1),)),))
    >>> viewer = LogprobViewer(table)
    >>> viewer.slider.value, "position 0 of 1" in viewer.view.value
    (0, True)
    """

    def __init__(self, table: LogprobTable, position: int = 0, **kwargs: Any):
        self.table = table
        self.slider = widgets.IntSlider(value=position, min=0, max=max(len(table) - 1, 0),
                                        description="position", continuous_update=True)
        self.view = widgets.HTML(render_position(table, position))
        super().__init__(children=[self.slider, self.view], **kwargs)
        self.slider.observe(self._on_position, names="value")

    @classmethod
    def from_response(cls, response: Any, choice: int = 0, tokenizer: Any = None,
                      **kwargs: Any) -> "LogprobViewer":
        """From anything `LogprobTable.from_response` reads (engine output, HTTP bodies)."""
        return cls(LogprobTable.from_response(response, choice, tokenizer), **kwargs)

    @property
    def row(self):
        """The selected `LogprobRow`."""
        return self.table[self.slider.value]

    def _on_position(self, change: dict) -> None:
        self.view.value = render_position(self.table, change["new"])

    def to_html(self) -> str:
        """The selected position as static HTML (where widgets don't render)."""
        return render_position(self.table, self.slider.value)

    def _repr_html_(self) -> str:
        return self.to_html()
