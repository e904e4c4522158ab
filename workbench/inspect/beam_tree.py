"""`BeamTree`: a beam search's tree of candidates (`workbench.engine.requests.beam_tree`), drawn.

The data and its queries (`best`, `path(i)`, `children`, `step`, `to_dict`) live next to the
algorithm in `workbench.engine.requests.beam_tree`, free of torch and of drawing; this subclass adds the
pandas frame, the inline-SVG `_repr_html_` (`beam_svg`) and a matplotlib `plot()`.
`BeamTree.of(data)` views an engine tree as one; `with_beam_tree(output)` does so for a
`BeamSearchOutput`, as the facades (`LLM`, `Workbench`, `remote_beam_search`) return them.

>>> tree = BeamTree([1], beam_width=1, length_penalty=1.0, nodes=[
...     BeamNode(0, 1, 5, "a", -0.1, -0.1, None, 1, "kept", -0.05)], returned=[0])
>>> tree.best.text, BeamTree.of(tree) is tree
('a', True)
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, fields, replace
from typing import Any

from workbench.display.figure import GREY, neutral
from workbench.display.frames import frame
from workbench.engine.requests.beam_tree import BeamNode, BeamTreeData
from workbench.inspect import beam_svg

__all__ = ["BeamNode", "BeamTree", "with_beam_tree"]  # BeamNode: its import path before the move


class BeamTree(BeamTreeData):
    """The tree as data (`BeamTreeData`) with a frame, inline SVG and a matplotlib plot."""

    @classmethod
    def of(cls, tree: BeamTreeData) -> "BeamTree":
        """This tree if it is one already, else a `BeamTree` sharing its fields."""
        if isinstance(tree, cls):
            return tree
        return cls(**{f.name: getattr(tree, f.name) for f in fields(tree)})

    def to_frame(self):
        """A pandas DataFrame, one row per node, indexed by node id."""
        # ids and ranks as integers with <NA> where there is none (a child of the prompt)
        return frame([asdict(n) for n in self.nodes], list(BeamNode.__dataclass_fields__),
                     dict.fromkeys(["parent", "rank", "returned"], "Int64")).set_index("id")

    # -- drawing -----------------------------------------------------------------------------
    def layout(self) -> dict[int | None, tuple[float, float]]:
        """(x, y) of each node id (None = the prompt): x by step, y by order within its step
        (children under their parent, by rank; every candidate, none folded)."""
        return beam_svg.layout(self)

    def _repr_html_(self) -> str:
        return self.to_svg(static=True)

    def to_svg(self, label: str = "cum_logprob", selected: int | None = None,
               highlight: Collection[int] | None = None, static: bool = False, *,
               expanded: Collection[int | None] | bool = (), zoom: float | None = None,
               interactive: bool = False, steps: int | None = None) -> str:
        """The tree as inline SVG with its legend (`workbench.inspect.beam_svg`): `label` is the
        number shown (`logprob`, `cum_logprob` or `score`), `selected` a node marked in yellow,
        `highlight` the node ids drawn as returned paths (default: this tree's); pruned
        candidates are folded per parent except under `expanded` (True: none folded); `zoom`
        a scale (None: fitted to the output's width); `static` adds a picture copy shown where
        the notebook is untrusted; `interactive`: clicks select (inside a `BeamExplorer`);
        `steps`: only steps 1..steps drawn."""
        return beam_svg.draw(self, label, selected, highlight, static, expanded=expanded,
                             zoom=zoom, interactive=interactive, steps=steps)

    def plot(self, ax=None):
        """Draws the tree with matplotlib (x = step, y = order); returns the Axes."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib
        from matplotlib.lines import Line2D

        if ax is None:
            rows = len(self.nodes) / max(self.num_steps, 1)
            _, ax = plt.subplots(figsize=(2 + 1.2 * self.num_steps, 1 + 0.25 * rows))
        pos = self.layout()
        on_path = {n.id for i in range(len(self.returned)) for n in self.path(i)}
        colour = {"kept": "tab:blue", "completed": "tab:green", "pruned": GREY}
        for n in self.nodes:
            (x1, y1), (x2, y2) = pos[n.parent], pos[n.id]
            ax.plot([x1, x2], [y1, y2], color="tab:red" if n.id in on_path else colour[n.status],
                    lw=1.5 if n.id in on_path else 0.6)
            ax.annotate(repr(n.text)[1:-1][:10], (x2, y2), fontsize=7, color=colour[n.status])
        ax.legend(handles=[Line2D([], [], color=c, label=s) for s, c in
                           (("kept", "tab:blue"), ("pruned", GREY),
                            ("completed", "tab:green"), ("returned", "tab:red"))],
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("step")
        ax.set_yticks([])
        ax.set_title(repr(self))
        return neutral(ax)


def with_beam_tree(output: Any) -> Any:
    """A `BeamSearchOutput` whose `.tree` is a drawable `BeamTree` (None stays None)."""
    if output.tree is None or isinstance(output.tree, BeamTree):
        return output
    return replace(output, tree=BeamTree.of(output.tree))
