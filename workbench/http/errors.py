"""HTTP error handling: every failure leaves as the OpenAI error envelope, never a 422.

Schema and JSON errors (FastAPI's `RequestValidationError`) become 400 with a readable message:
a request check that refused it answers with its own sentence and type `BadRequestError`, as
vLLM's validators do; other schema errors are "Bad Request" with one line per error in vLLM's
wording, pydantic's error dict (at most 10, inputs cut to 200 characters), which clients match.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from workbench.errors import ValidationError
from workbench.serving.errors import error_response, make_error

logger = logging.getLogger("workbench.http")

UNSUPPORTED_MEDIA_TYPE = "Unsupported Media Type: Only 'application/json' is allowed"
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


def validate_error_json(exc: Any) -> JSONResponse:
    """A pydantic `ValidationError` raised inside a route (a sub-request's model) as the 400
    a body's schema error gets."""
    return JSONResponse(validation_error_body(list(exc.errors(include_url=False))),
                        status_code=400)


async def request_validation_handler(request: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse(validation_error_body(list(exc.errors())), status_code=400)


async def http_exception_handler(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    phrase = HTTPStatus(exc.status_code).phrase
    body = make_error(str(exc.detail), phrase, HTTPStatus(exc.status_code))
    return JSONResponse(body.model_dump(), status_code=exc.status_code, headers=exc.headers)


async def unexpected_error_handler(request: Request, exc: Exception) -> JSONResponse:
    return error_json(exc, log_stack=True)


def error_json(exc: BaseException, *, log_stack: bool = False) -> JSONResponse:
    """Any exception a route caught, as the error envelope with its status."""
    body = error_response(exc, log_stack=log_stack)
    retry_after = getattr(exc, "retry_after", None)  # a full queue: when to come back
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(body.model_dump(), status_code=body.error.code, headers=headers)


def validate_json_request(request: Request) -> None:
    """Route dependency: only `application/json` bodies (400, vLLM's exact message)."""
    media_type = request.headers.get("content-type", "").lower().split(";", 1)[0].strip()
    if media_type != "application/json":
        raise RequestValidationError(errors=[UNSUPPORTED_MEDIA_TYPE])
