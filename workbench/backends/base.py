"""`Backend`: what a `Workbench` needs from where its requests run.

Two implement it: `_Local` (`workbench/backends/local.py`), the serving objects on an in-kernel
async engine, and `_Remote` (`workbench/backends/remote.py`), any OpenAI-compatible server over
httpx. Both take the same request bodies (dicts, as the HTTP API's JSON) and give the same
`Result`s (`workbench/backends/result.py`), so every `Workbench` call runs on its backend. `endpoint` names the
route: "completions", "chat", "tokenize", "detokenize", "models", "embeddings", "score",
"rerank", "classify", "pooling"; `compare` is ours (`/v1/compare`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from workbench.inspect.model_compare import ModelComparison

if TYPE_CHECKING:  # annotations only
    from workbench.backends.result import Result
    from workbench.engine.requests.beam_search import BeamSearchOutput
    from workbench.inspect.validation_report import ValidationReport
    from workbench.sampling_params import BeamSearchParams


@runtime_checkable
class Backend(Protocol):
    """Where a `Workbench`'s requests run (see the module docstring)."""

    model: str  # the served model's name

    @property
    def ours(self) -> bool:
        """Whether requests reach a workbench server (or engine): it takes our extras."""
        ...

    def generate(self, endpoint: str, body: dict[str, Any]) -> Result:
        """A completions or chat request, answered whole."""
        ...

    def generate_many(self, endpoint: str, bodies: list[dict[str, Any]]) -> list[Result]:
        """Several completions or chat requests in flight at once (so the engine may batch
        them), answered whole, in order."""
        ...

    def stream(self, endpoint: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """A streamed completions or chat request: its chunks as dicts."""
        ...

    def call(self, endpoint: str, body: dict[str, Any] | None) -> Result:
        """tokenize, detokenize, or models (body None: a GET)."""
        ...

    def respond(self, body: dict[str, Any]) -> Result:
        """A `/v1/responses` request (the tool loop), answered whole."""
        ...

    def stream_respond(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """A streamed `/v1/responses` request: its events as dicts."""
        ...

    def pooling(self, endpoint: str, body: dict[str, Any]) -> Result:
        """embeddings, score, rerank, classify or pooling."""
        ...

    def compare(self, body: dict[str, Any]) -> Result:
        """Our `/v1/compare` (a workbench extension): variants of the model on one text."""
        ...

    def validate(self, body: dict[str, Any]) -> ValidationReport:
        """A dry run: the checks a request would meet, without generating."""
        ...

    def beam_search(self, prompt: Any, params: BeamSearchParams, tokenizer: Any
                    ) -> BeamSearchOutput:
        """A beam search with its tree (the tokenizer: only where the search runs client-side)."""
        ...

    def tokenizer(self) -> Any:
        """The served model's tokenizer: the engine's, or for a remote server ours of the same
        model (an alias or a local directory), as the client-side steps need it."""
        ...

    def close(self) -> None:
        """Releases what the backend holds (its engine, loop thread, or HTTP client)."""
        ...


def with_model(body: dict[str, Any], model: str) -> dict[str, Any]:
    """`body` without its None fields (but `max_tokens`), naming `model` unless it names one."""
    body = {k: v for k, v in body.items() if v is not None or k == "max_tokens"}
    body.setdefault("model", model)
    return body


def compared(result: Result) -> Result:
    """A `/v1/compare` answer with its `ModelComparison`."""
    if result.ok and result.response is not None:
        result.comparison = ModelComparison.from_body(result.response)
    return result
