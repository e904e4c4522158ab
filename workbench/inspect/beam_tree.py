"""`BeamTree`: every candidate a beam search considered, step by step, as plain data.

Each step expands every live beam into its top `2 * beam_width` tokens. Every such candidate is
a `BeamNode`: its step (1 = the first generated token), token id and text, logprob, cumulative
logprob, parent node (None = the prompt), rank among its parent's candidates (1 = most likely),
status (`kept`: went on to the next step, `pruned`: dropped, `completed`: ended in EOS) and its
length-penalised score. `returned` lists the nodes of the returned sequences, best first.

>>> tree = BeamTree([1], beam_width=1, length_penalty=1.0, nodes=[
...     BeamNode(0, 1, 5, "a", -0.1, -0.1, None, 1, "kept", -0.05),
...     BeamNode(1, 1, 6, "b", -2.0, -2.0, None, 2, "pruned", -1.0)], returned=[0])
>>> tree.best.text, len(tree), [n.id for n in tree.path(0)]
('a', 2, [0])
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from collections.abc import Collection
from typing import Any

STATUSES = ("kept", "pruned", "completed")


@dataclass(frozen=True)
class BeamNode:
    """One candidate token of one step (see the module docstring)."""

    id: int
    step: int
    token_id: int
    text: str
    logprob: float
    cum_logprob: float
    parent: int | None  # node id, None = a child of the prompt
    rank: int  # 1-based, among its parent's candidates
    status: str  # kept | pruned | completed
    score: float  # cum_logprob / len ** length_penalty, as in the final ranking
    returned: int | None = None  # its position among the returned sequences, best = 0


@dataclass
class BeamTree:
    """The candidates of a beam search (module docstring); `tree[i]`, `tree.best`, `tree.path(i)`."""

    prompt_token_ids: list[int]
    beam_width: int
    length_penalty: float
    nodes: list[BeamNode] = field(default_factory=list)
    returned: list[int] = field(default_factory=list)  # node ids, best first
    prompt_text: str | None = None

    # -- access ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i: int) -> BeamNode:
        return self.nodes[i]

    def __iter__(self):
        return iter(self.nodes)

    @property
    def num_steps(self) -> int:
        return max((n.step for n in self.nodes), default=0)

    @property
    def best(self) -> BeamNode | None:
        """The last node of the best returned sequence."""
        return self.nodes[self.returned[0]] if self.returned else None

    def path(self, i: int = 0) -> list[BeamNode]:
        """The nodes from step 1 to the end of the i-th returned sequence (0 = best)."""
        node: BeamNode | None = self.nodes[self.returned[i]]
        out = []
        while node is not None:
            out.append(node)
            node = None if node.parent is None else self.nodes[node.parent]
        return out[::-1]

    def children(self, node_id: int | None) -> list[BeamNode]:
        """The candidates expanded from a node (None: from the prompt)."""
        return [n for n in self.nodes if n.parent == node_id]

    def step(self, s: int) -> list[BeamNode]:
        return [n for n in self.nodes if n.step == s]

    # -- export ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"prompt_token_ids": list(self.prompt_token_ids), "prompt_text": self.prompt_text,
                "beam_width": self.beam_width, "length_penalty": self.length_penalty,
                "returned": list(self.returned), "nodes": [asdict(n) for n in self.nodes]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BeamTree":
        return cls(d["prompt_token_ids"], d["beam_width"], d["length_penalty"],
                   [BeamNode(**n) for n in d["nodes"]], list(d["returned"]), d.get("prompt_text"))

    def to_frame(self):
        """A pandas DataFrame, one row per node, indexed by node id."""
        import pandas as pd

        cols = list(BeamNode.__dataclass_fields__)
        frame = pd.DataFrame([asdict(n) for n in self.nodes], columns=cols)
        return frame.set_index("id")

    def __repr__(self) -> str:
        best = self.best
        best_text = "—" if best is None else f"{best.score:.4f}"
        return (f"BeamTree(width={self.beam_width}, steps={self.num_steps}, nodes={len(self)}, "
                f"returned={len(self.returned)}, best_score={best_text})")

    # -- drawing -----------------------------------------------------------------------------
    def layout(self) -> dict[int | None, tuple[float, float]]:
        """(x, y) of each node id (None = the prompt): x by step, y by order within its step."""
        pos: dict[int | None, tuple[float, float]] = {None: (0.0, 0.0)}
        by_step: dict[int, list[BeamNode]] = {}
        for n in self.nodes:
            by_step.setdefault(n.step, []).append(n)
        for s, nodes in by_step.items():
            # parents' order first, then rank: children sit near their parent
            nodes = sorted(nodes, key=lambda n: (pos.get(n.parent, (0, 0))[1], n.rank))
            for y, n in enumerate(nodes):
                pos[n.id] = (float(s), float(y))
        return pos

    def _repr_html_(self) -> str:
        return self.to_svg(static=True)

    def to_svg(self, label: str = "cum_logprob", selected: int | None = None,
               highlight: Collection[int] | None = None, static: bool = False) -> str:
        """The tree as inline SVG with its legend (`workbench.inspect.beam_svg`): `label` is the
        number shown (`logprob`, `cum_logprob` or `score`), `selected` a node marked in yellow,
        `highlight` the node ids drawn as returned paths (default: this tree's); `static` adds
        a picture copy shown where the notebook is untrusted."""
        from workbench.inspect.beam_svg import draw

        return draw(self, label, selected, highlight, static)

    def plot(self, ax=None):
        """Draws the tree with matplotlib (x = step, y = order); returns the Axes."""
        import matplotlib.pyplot as plt

        if ax is None:
            rows = len(self.nodes) / max(self.num_steps, 1)
            _, ax = plt.subplots(figsize=(2 + 1.2 * self.num_steps, 1 + 0.25 * rows))
        pos = self.layout()
        on_path = {n.id for i in range(len(self.returned)) for n in self.path(i)}
        colour = {"kept": "tab:blue", "completed": "tab:green", "pruned": "lightgrey"}
        for n in self.nodes:
            (x1, y1), (x2, y2) = pos[n.parent], pos[n.id]
            ax.plot([x1, x2], [y1, y2], color="tab:red" if n.id in on_path else colour[n.status],
                    lw=1.5 if n.id in on_path else 0.6)
            ax.annotate(repr(n.text)[1:-1][:10], (x2, y2), fontsize=7, color=colour[n.status])
        from matplotlib.lines import Line2D

        ax.legend(handles=[Line2D([], [], color=c, label=s) for s, c in
                           (("kept", "tab:blue"), ("pruned", "lightgrey"),
                            ("completed", "tab:green"), ("returned", "tab:red"))],
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("step")
        ax.set_yticks([])
        ax.set_title(repr(self))
        return ax
