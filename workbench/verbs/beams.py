"""`beam_search` with its tree: which searches to run, and each result with its `BeamTree`.

A `BeamPlan` is one search per prompt with the same `BeamSearchParams`: the `LLM` queues them
all on its engine (a search reports once, at its end, so its progress is counted in `steps`),
a `Workbench` runs its one prompt on its back end (in the engine, or client-side over
`/v1/completions`: `workbench.inspect.remote_beam`). `assemble` gives each `BeamSearchOutput`
its `BeamTree` (`workbench.inspect.beam_tree`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.engine.requests.beam_search import BeamSearchOutput
from workbench.inspect.beam_tree import with_beam_tree
from workbench.sampling_params import BeamSearchParams

__all__ = ["BeamPlan"]


@dataclass(frozen=True)
class BeamPlan:
    """A beam search of each of `prompts` (text or token ids) with `params`."""

    prompts: list[Any]
    params: BeamSearchParams

    @classmethod
    def of(cls, prompts: Sequence[Any], beam_width: int = 4, max_tokens: int = 16,
           length_penalty: float = 1.0, ignore_eos: bool = False) -> "BeamPlan":
        """The plan of `prompts` from the search's settings, as `Workbench.beam_search`
        takes them."""
        return cls(list(prompts), BeamSearchParams(beam_width=beam_width, max_tokens=max_tokens,
                                                   length_penalty=length_penalty,
                                                   ignore_eos=ignore_eos))

    @property
    def steps(self) -> int:
        """The engine steps of all searches at most (a search ends by its last step)."""
        return len(self.prompts) * self.params.max_tokens

    def assemble(self, outputs: Sequence[BeamSearchOutput]) -> list[BeamSearchOutput]:
        """Each search's output with its `BeamTree` (`.tree`), in the order of the prompts."""
        return [with_beam_tree(out) for out in outputs]
