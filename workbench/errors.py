"""Errors the engine and the serving layer raise: input they cannot honour, engine failures.

`ValidationError` is a `ValueError` that names the offending parameter and its value, like
vLLM's `VLLMValidationError`: its `str()` ends with ``(parameter=NAME, value=VALUE)`` and the
serving layer turns it into a 400 `BadRequestError` whose `param` is `NAME`.
"""

from __future__ import annotations

from typing import Any, NoReturn


class ValidationError(ValueError):
    """A request value the engine can't honour.

    >>> str(ValidationError("top_p must be in (0, 1], got 2.0.", parameter="top_p", value=2.0))
    'top_p must be in (0, 1], got 2.0. (parameter=top_p, value=2.0)'
    """

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None):
        super().__init__(message)
        self.message = message
        self.parameter = parameter
        self.value = value

    def __str__(self) -> str:
        extras = []
        if self.parameter is not None:
            extras.append(f"parameter={self.parameter}")
        if self.value is not None:
            extras.append(f"value={self.value}")
        return f"{self.message} ({', '.join(extras)})" if extras else self.message


def refuse(message: str, parameter: str | None = None, value: Any = None) -> NoReturn:
    """Raises the `ValidationError` for `parameter` (a check's one-line refusal)."""
    raise ValidationError(message, parameter=parameter, value=value)


class NotFoundError(LookupError):
    """A named thing (model, adapter) that does not exist: 404 over HTTP."""

    def __init__(self, message: str, *, parameter: str | None = None):
        super().__init__(message)
        self.message = message
        self.parameter = parameter


class ServiceUnavailableError(RuntimeError):
    """The server can't take a request now (its waiting queue is full): 503 with Retry-After."""

    def __init__(self, message: str, *, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after


class RequestTimeoutError(TimeoutError):
    """A request ran past the server's `--request-timeout` and was aborted: 504."""


class EngineDeadError(RuntimeError):
    """The engine loop stopped after an unrecoverable error; no request can be served."""


class EngineStepError(RuntimeError):
    """Requests the engine failed inside a step (the model's forward, the sampler, ...), raised
    by the offline `LLM`: the message names each request and its cause; `errors` maps request
    ids to causes, and `outputs` holds every output of the call, in prompt order (the failed
    ones with finish_reason "error" and their `error`). The engine's log has the traceback.

    >>> str(EngineStepError({"llm-0": "RuntimeError: boom"}))
    'Request llm-0 failed in the engine: RuntimeError: boom'
    """

    def __init__(self, errors: dict[str, str], outputs: list[Any] | None = None):
        super().__init__(_failures(errors))
        self.errors = errors
        self.outputs = outputs or []


def _failures(errors: dict[str, str], shown: int = 5) -> str:
    """One line: each cause once, with (up to `shown` of) the requests it ended."""
    if len(errors) == 1:
        ((rid, cause),) = errors.items()
        return f"Request {rid} failed in the engine: {cause}"
    by_cause: dict[str, list[str]] = {}
    for rid, cause in errors.items():
        by_cause.setdefault(cause, []).append(rid)
    parts = []
    for cause, ids in by_cause.items():
        more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
        parts.append(f"{cause} ({', '.join(ids[:shown])}{more})")
    return f"{len(errors)} requests failed in the engine: {'; '.join(parts)}"
