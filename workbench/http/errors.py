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

from workbench.serving.errors import error_response, make_error, validation_error_body

logger = logging.getLogger("workbench.http")

UNSUPPORTED_MEDIA_TYPE = "Unsupported Media Type: Only 'application/json' is allowed"
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
