"""The error model: every failure becomes `ErrorResponse{error: {message, type, param, code}}`.

`error_response(exc)` maps an exception to the envelope as vLLM's server does (reference §4):
`ValidationError` -> 400 `BadRequestError` with `param`; `NotFoundError` -> 404; other
`ValueError`/`TypeError`/`RuntimeError`/`OverflowError` and jinja template errors -> 400;
`NotImplementedError` -> 501; a generation that ended with finish_reason "error" (or the
offline `EngineStepError`) -> 500 "Internal server error"; anything else -> 500
`InternalServerError`. Messages are sanitized: no tracebacks, memory addresses or file paths
reach the client.
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus
from typing import Any

from workbench.errors import (
    EngineDeadError,
    EngineStepError,
    NotFoundError,
    RequestTimeoutError,
    ServiceUnavailableError,
    ValidationError,
)
from workbench.serving.protocol.common import ErrorInfo, ErrorResponse

logger = logging.getLogger("workbench.serving")

ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class ServingError(Exception):
    """Ends a request with a ready error envelope (a pipeline stage decided the answer)."""

    def __init__(self, response: ErrorResponse):
        super().__init__(response.error.message)
        self.response = response

    @property
    def status_code(self) -> int:
        return self.response.error.code


class GenerationError(Exception):
    """The engine finished a sequence with finish_reason "error"."""

    def __init__(self, message: str = "Internal server error"):
        super().__init__(message)


def make_error(message: str, err_type: str = "BadRequestError",
               status: HTTPStatus = HTTPStatus.BAD_REQUEST, param: str | None = None) -> ErrorResponse:
    return ErrorResponse(error=ErrorInfo(message=sanitize_message(message), type=err_type,
                                         param=param, code=int(status)))


def _is_template_error(exc: BaseException) -> bool:
    return any(cls.__name__ == "TemplateError" for cls in type(exc).__mro__)


def error_response(exc: BaseException, *, log_stack: bool = False,
                   quiet: bool = False) -> ErrorResponse:
    """Maps any exception to the error envelope (status = `response.error.code`); `quiet`
    classifies without logging (the metrics middleware counting what the handler answers)."""
    if log_stack:
        logger.error("request failed", exc_info=exc)
    if isinstance(exc, ServingError):
        return exc.response
    if isinstance(exc, ValidationError):
        return make_error(str(exc), param=exc.parameter)
    if isinstance(exc, NotFoundError):
        return make_error(exc.message, "NotFoundError", HTTPStatus.NOT_FOUND, exc.parameter)
    if isinstance(exc, GenerationError):
        return make_error(str(exc), "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR)
    if isinstance(exc, EngineStepError):  # the offline LLM's: the engine's log has the cause
        return make_error(str(GenerationError()), "InternalServerError",
                          HTTPStatus.INTERNAL_SERVER_ERROR)
    if isinstance(exc, ServiceUnavailableError):
        return make_error(str(exc), "ServiceUnavailableError", HTTPStatus.SERVICE_UNAVAILABLE)
    if isinstance(exc, RequestTimeoutError):
        return make_error(str(exc), "TimeoutError", HTTPStatus.GATEWAY_TIMEOUT)
    if isinstance(exc, EngineDeadError):
        return make_error(ENGINE_DEAD_MESSAGE, "InternalServerError",
                          HTTPStatus.INTERNAL_SERVER_ERROR)
    if isinstance(exc, NotImplementedError):
        return make_error(str(exc), "NotImplementedError", HTTPStatus.NOT_IMPLEMENTED)
    if isinstance(exc, (ValueError, TypeError, RuntimeError, OverflowError)) or _is_template_error(exc):
        return make_error(str(exc))
    if not log_stack and not quiet:
        logger.error("unexpected error while serving a request", exc_info=exc)
    return make_error(str(exc) or type(exc).__name__, "InternalServerError",
                      HTTPStatus.INTERNAL_SERVER_ERROR)


def sanitize_message(message: str) -> str:
    """Strips memory addresses, traceback lines and file paths from an error message."""
    message = re.sub(r" at 0x[0-9a-f]+>", ">", message)
    message = re.sub(r'\n?\s*File "[^"]+", line \d+, in \S+(\n\s+.*)?', "", message)
    message = re.sub(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv|work)(?:/[\w.\-]+)+",
                     "<path>", message)
    message = re.sub(r"(?:/[\w\-]+)+/[\w\-]+\.\w+", "<path>", message)
    return message.strip()


# -- schema errors (pydantic / FastAPI), as vLLM's server words them ---------------------------
_MAX_ERRORS = 10
_MAX_INPUT_CHARS = 200
_MAX_LINE_CHARS = 1000
_INTERNAL_LOC = {"function-wrap", "function-after", "function-before", "function-plain",
                 "json-or-python", "lax-or-strict", "chain", "default", "nullable",
                 "tagged-union", "union", "str", "int", "float", "bool", "list", "dict", "none"}


def clean_loc(loc: tuple) -> str:
    """`('body', 'list[int]', 'prompt')` -> "body.prompt": pydantic's internal markers dropped."""
    parts = [str(p) for p in loc
             if not any(c in str(p) for c in "[](){}") and str(p).lower() not in _INTERNAL_LOC]
    return ".".join(parts) if parts else ".".join(str(p) for p in loc)


def _summarize(value: Any) -> Any:
    """A size-bounded stand-in for an error's `input` (containers described, not rendered)."""
    if isinstance(value, (bytes, bytearray)):
        return f"<{type(value).__name__} of {len(value)} bytes>"
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = value if isinstance(value, str) else _str(value)
    return text if len(text) <= _MAX_INPUT_CHARS else text[:_MAX_INPUT_CHARS] + "...[truncated]"


def _str(value: Any) -> str:
    try:
        return str(value)
    except ValueError:  # an int past sys.get_int_max_str_digits()
        return f"<{type(value).__name__}>"


def _line(err: Any) -> str:
    """One error as vLLM renders it: a request check's own sentence, else pydantic's error dict
    (`type`, `loc` as "body.seed", `msg`, `input` bounded, `ctx`), cut at 1,000 characters."""
    if not isinstance(err, dict):
        return str(err)
    check = (err.get("ctx") or {}).get("error")
    if isinstance(check, ValidationError):
        return str(check)  # the message with vLLM's (parameter=..., value=...) suffix
    shown = {key: value for key, value in err.items() if key != "url"}
    if "input" in shown:
        shown["input"] = _summarize(shown["input"])
    if isinstance(shown.get("loc"), (tuple, list)):
        shown["loc"] = clean_loc(tuple(shown["loc"]))
    text = str(shown)
    return text if len(text) <= _MAX_LINE_CHARS else text[:_MAX_LINE_CHARS] + "...[truncated]"


def validation_error_body(errors: list[Any]) -> dict[str, Any]:
    """The error envelope for a list of pydantic / FastAPI validation errors.

    A single failed request check (one of vLLM's own validators) answers as vLLM does: its
    sentence, type `BadRequestError`, its parameter (or none). Schema errors are
    "N validation error(s)" with type "Bad Request" and the first error's location as param.
    """
    checks = [e for e in errors if isinstance(e, dict) and isinstance(
        (e.get("ctx") or {}).get("error"), ValidationError)]
    if len(errors) == 1 and checks:
        check = checks[0]["ctx"]["error"]
        body = make_error(_line(errors[0]), "BadRequestError", HTTPStatus.BAD_REQUEST,
                          check.parameter)
        return body.model_dump()
    param = None
    for err in checks:
        param = err["ctx"]["error"].parameter
        break
    if param is None and errors and isinstance(errors[0], dict) and errors[0].get("loc"):
        param = clean_loc(tuple(errors[0]["loc"]))
    if errors:
        label = "error" if len(errors) == 1 else "errors"
        lines = [f"  {_line(e)}" for e in errors[:_MAX_ERRORS]]
        if len(errors) > _MAX_ERRORS:
            lines.append(f"  ...and {len(errors) - _MAX_ERRORS} more {label}")
        message = f"{len(errors)} validation {label}:\n" + "\n".join(lines)
    else:
        message = "Validation error"
    body = make_error(message, HTTPStatus.BAD_REQUEST.phrase, HTTPStatus.BAD_REQUEST, param)
    return body.model_dump()
