"""The error model: every failure becomes `ErrorResponse{error: {message, type, param, code}}`.

`error_response(exc)` maps an exception to the envelope as vLLM's server does (reference §4):
`ValidationError` -> 400 `BadRequestError` with `param`; `NotFoundError` -> 404; other
`ValueError`/`TypeError`/`RuntimeError`/`OverflowError` and jinja template errors -> 400;
`NotImplementedError` -> 501; a generation that ended with finish_reason "error" -> 500;
anything else -> 500 `InternalServerError`. Messages are sanitized: no tracebacks, memory
addresses or file paths reach the client.
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus

from workbench.errors import (
    EngineDeadError, NotFoundError, RequestTimeoutError, ServiceUnavailableError, ValidationError,
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
