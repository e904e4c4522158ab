"""The contract of a per-kind request handler (generation, beam search, pooling).

Each step the engine gives every handler the (sequence, logits row) pairs of its requests'
sequences that completed a token (`advance`), then asks the handler of each request the step
touched for its output (`output`), or for the smallest output of a request that failed
(`error_output`). Handlers keep no per-request state: it lives on `Request` / `Sequence`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.engine.engine import LLMEngine
    from workbench.engine.request import Request, Sequence
    from workbench.engine.runner import LogitRows


class KindHandler(ABC):
    """One kind of request, as the engine's step drives it (see the module docstring)."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine  # its scheduler, block manager, sampler and output processor

    @abstractmethod
    def advance(self, batch: list[tuple[Sequence, int]], rows: LogitRows) -> None:
        """Advances these sequences (none of them errored) from their rows of `rows`.

        A failure contained to one request ends it with `engine.fail_request`."""

    @abstractmethod
    def output(self, req: Request) -> Any | None:
        """The request's output for this step; None when it has nothing to report."""

    @abstractmethod
    def error_output(self, req: Request) -> Any:
        """The output of a request that failed, built without anything that may have failed."""
