"""The contract of a per-kind request handler (generation, beam search, pooling).

Each step the engine gives every handler the (sequence, logits row) pairs of its requests'
sequences that completed a token (`compute`); the handler computes what they get — sampled
tokens, a beam search's next beams, pooled results, or a failure — into the step's
`StepResults`, which the bookkeeper (`engine/bookkeeper.py`) then applies. The engine then
asks the handler of each request the step touched for its output (`output`), or for the
smallest output of a request that failed (`error_output`).

A handler is built with only what it needs (its sampler, the input and output processors,
model facts), never the engine: it queues, frees and counts nothing. Per-request state lives
on `Request` / `Sequence`; a kind's own state there (a seeded generator, a search's beams and
candidates) is the handler's to advance.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from workbench.engine.requests.request import Request, RequestKind, Sequence
    from workbench.engine.requests.step_results import StepResults
    from workbench.engine.step.runner import LogitRows


class KindHandler(ABC):
    """One kind of request, as the engine's step drives it (see the module docstring)."""

    kind: ClassVar[RequestKind]  # the `Request.kind` it drives

    @abstractmethod
    def compute(self, batch: list[tuple[Sequence, int]], rows: LogitRows,
                results: StepResults) -> None:
        """These sequences' (none of them errored) results from their rows of `rows`.

        A failure contained to one request goes to `results.fail`."""

    @abstractmethod
    def output(self, req: Request) -> Any | None:
        """The request's output for this step; None when it has nothing to report."""

    @abstractmethod
    def error_output(self, req: Request) -> Any:
        """The output of a request that failed, built without anything that may have failed."""
