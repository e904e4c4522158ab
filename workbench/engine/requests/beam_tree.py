"""`BeamNode` and `BeamTreeData`: every candidate a beam search considered, as plain data.

Each step expands every live beam into its top `2 * beam_width` tokens. Every such candidate is
a `BeamNode`: its step (1 = the first generated token), token id and text, logprob, cumulative
logprob, parent node (None = the prompt), rank among its parent's candidates (1 = most likely),
status (`kept`: went on to the next step, `pruned`: dropped, `completed`: ended in EOS) and its
length-penalised score. `returned` lists the nodes of the returned sequences, best first.
No torch, no drawing: `workbench.inspect.BeamTree` adds the frame, SVG and plot.

>>> tree = BeamTreeData([1], beam_width=1, length_penalty=1.0, nodes=[
...     BeamNode(0, 1, 5, "a", -0.1, -0.1, None, 1, "kept", -0.05),
...     BeamNode(1, 1, 6, "b", -2.0, -2.0, None, 2, "pruned", -1.0)], returned=[0])
>>> tree.best.text, len(tree), [n.id for n in tree.path(0)]
('a', 2, [0])
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
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
class BeamTreeData:
    """The candidates of a beam search (module docstring): `tree[i]`, `best`, `path(i)`."""

    prompt_token_ids: list[int]
    beam_width: int
    length_penalty: float
    nodes: list[BeamNode] = field(default_factory=list)
    returned: list[int] = field(default_factory=list)  # node ids, best first
    prompt_text: str | None = None

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

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_token_ids": list(self.prompt_token_ids), "prompt_text": self.prompt_text,
                "beam_width": self.beam_width, "length_penalty": self.length_penalty,
                "returned": list(self.returned), "nodes": [asdict(n) for n in self.nodes]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        return cls(d["prompt_token_ids"], d["beam_width"], d["length_penalty"],
                   [BeamNode(**n) for n in d["nodes"]], list(d["returned"]), d.get("prompt_text"))

    def __repr__(self) -> str:
        best = self.best
        best_text = "—" if best is None else f"{best.score:.4f}"
        return (f"{type(self).__name__}(width={self.beam_width}, steps={self.num_steps}, "
                f"nodes={len(self)}, returned={len(self.returned)}, best_score={best_text})")
