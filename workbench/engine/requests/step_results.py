"""What one engine step computed for its requests, before any of it is applied.

Each kind handler (`engine/handlers/`) fills one `StepResults` from the step's logits rows:
the sampled tokens, each beam search's next beams, the pooled results, and the requests whose
part of the computation failed. It changes no token list, queue, block or counter: the
bookkeeper (`engine/bookkeeper.py`) applies all of it in one place, as vLLM's
`update_from_output`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    import torch

    from workbench.engine.requests.outputs import TokenStats
    from workbench.engine.requests.request import Request, Sequence

# (token, logprob, rank, top ids, top logprobs, tracked ids' (ids, logprobs, ranks), its
# `TokenStats`): the arguments of `OutputProcessor.append_token` after the sequence
SampledToken = tuple[int, float | None, int | None, list[int] | None, list[float] | None,
                     tuple[list[int], list[float], list[int]] | None, "TokenStats | None"]


@dataclass
class NextBeams:
    """A beam search that took a step: its next sequences are forks of its current ones.

    New beam `i` continues the current sequence `parents[i]` with `tokens[i]`; current
    sequences no new beam continues end. `done`: the search is over, every beam ends."""

    request: Request
    parents: list[int]
    tokens: list[int]
    done: bool


@dataclass
class StepResults:
    """One step's computed results, by kind (see the module docstring)."""

    sampled: list[tuple[Sequence, SampledToken]] = field(default_factory=list)
    beams: list[NextBeams] = field(default_factory=list)
    pooled: list[tuple[Sequence, torch.Tensor]] = field(default_factory=list)  # [D] each
    failed: dict[str, tuple[Request, BaseException]] = field(default_factory=dict)  # by id

    def fail(self, req: Request, exc: BaseException) -> None:
        """This request's part of the step failed (its first failure is the one reported)."""
        self.failed.setdefault(req.request_id, (req, exc))

    def has_failed(self, req: Request) -> bool:
        """Failed earlier in this step, or recorded failing here."""
        return req.errored or req.request_id in self.failed
