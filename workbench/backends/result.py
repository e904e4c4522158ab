"""`Result`: one endpoint call of a `Workbench`, as either back end gives it.

The response body (or the error envelope instead of raising) and the inspect objects built
from it: `.logprobs` / `table(i)` (`LogprobTable`), `.parsed(i)` (`ParsedOutput`), `.report`
(`ValidationReport`), `.trace` (`Trace`), `.tool_loop`, `.similarity`, `.activations`
(`ActivationCache`) and `.logit_lens` (`LogitLens`) of a `capture` / `logit_lens`, `.scores` (a
`LogprobTable` of each scored text's tokens, `Workbench.score_text` / `score_chat`),
`.comparison` (a `ModelComparison`, `Workbench.compare`). Both back ends
(`workbench/backends/local.py`, `remote.py`) return it and `workbench/workbench.py` hands it
out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.inspect.logprob_table import LogprobTable
from workbench.inspect.parsed_output import ParsedOutput
from workbench.inspect.similarity import SimilarityMatrix
from workbench.inspect.trace import Trace
from workbench.inspect.validation_report import ValidationReport


@dataclass
class Result:
    """One endpoint call: the response body (or the error envelope) and its inspect objects."""

    response: dict[str, Any] | None
    status_code: int = 200
    error: dict[str, Any] | None = None
    report: ValidationReport | None = None
    trace: Trace | None = None
    tool_loop: Any = None  # `respond`: a ToolLoopTrace (workbench.inspect.tool_loop)
    similarity: SimilarityMatrix | None = None  # embed / score / rerank
    scores: list[LogprobTable] | None = None  # score_text / score_chat: one table per text
    request: dict[str, Any] | None = None  # completions / chat: the body sent (`branch`, `replay`)
    comparison: Any = None  # compare: a ModelComparison (workbench.inspect.model_compare)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def logprobs(self) -> LogprobTable | None:
        """Choice 0's logprobs (`table(i)` for another choice); None without any."""
        return self.table(0)

    def table(self, choice: int = 0) -> LogprobTable | None:
        if not self.response or "choices" not in self.response:
            return None
        table = LogprobTable.from_response(self.response, choice)
        return table if (len(table) or table.prompt) else None

    def parsed(self, choice: int = 0, **parsers: Any) -> Any:
        """A chat choice's tokens marked reasoning / content / tool_call (`ParsedOutput`); name
        the server's parsers (`reasoning_parser=`, `tool_parser=`); None without logprobs."""
        choices = (self.response or {}).get("choices") or []
        if not any(c.get("index") == choice and (c.get("logprobs") or {}).get("content")
                   is not None and "message" in c for c in choices):
            return None
        return ParsedOutput.from_chat(self.response, choice, **parsers)

    @property
    def activations(self) -> Any:
        """Choice 0's `capture` as an `ActivationCache` (`workbench.inspect`), decoded from the
        response's wire form; None when the request asked for none."""
        return self._inside(0, "activations")

    @property
    def logit_lens(self) -> Any:
        """Choice 0's `logit_lens` as a `LogitLens`; None when the request asked for none."""
        return self._inside(0, "logit_lens")

    @property
    def features(self) -> Any:
        """Choice 0's `features` as `FeatureActivations`; None when the request asked for none."""
        return self._inside(0, "features")

    def _inside(self, choice: int, key: str) -> Any:
        choices = (self.response or {}).get("choices") or []
        wire = next((c.get(key) for c in choices if c.get("index") == choice), None)
        if wire is None:
            return None
        if key == "activations":  # deferred: the views load lazily (no pandas at import)
            from workbench.inspect.activations import ActivationCache

            return ActivationCache.from_wire(wire)
        if key == "features":
            from workbench.inspect.features import FeatureActivations

            return FeatureActivations.from_wire(wire)
        from workbench.inspect.logit_lens import LogitLens

        return LogitLens.from_wire(wire)

    @property
    def text(self) -> str | None:
        """Choice 0's text (completions), message content (chat) or output text (responses)."""
        if self.response and self.response.get("object") == "response":
            return "".join(p.get("text", "") for item in self.response.get("output", [])
                           if item.get("type") == "message" for p in item.get("content", []))
        if not self.response or not self.response.get("choices"):
            return None
        first = self.response["choices"][0]
        return first["message"]["content"] if "message" in first else first.get("text")

    def __repr__(self) -> str:
        what = f"text={self.text!r}" if self.ok else f"error={self.error['error']['message']!r}"
        return f"Result({self.status_code}, {what})"
