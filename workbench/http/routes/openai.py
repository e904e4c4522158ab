"""`/v1/models`, `/v1/completions`, `/v1/chat/completions`: parse, serve, answer JSON or SSE."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from workbench.http.cancellation import with_cancellation
from workbench.http.errors import error_json, validate_json_request
from workbench.http.routes import request_meta
from workbench.http.sse import sse_response
from workbench.inspect.validation_report import validate
from workbench.serving.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelList,
)

router = APIRouter()
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 500, 501)}


async def _serve(raw: Request, serving: Any, request: Any) -> Response:
    """Streaming -> SSE after the first output; otherwise one JSON body. Errors -> envelope."""
    meta = request_meta(raw)
    log_stack = raw.app.state.server_config.log_error_stack
    try:
        if request.stream:
            stream = await with_cancellation(raw, serving.create_stream(request, meta))
            return (Response(status_code=499) if stream is None
                    else sse_response(stream, raw.app.state.drain))
        response = await with_cancellation(raw, serving.create(request, meta))
    except Exception as exc:  # noqa: BLE001 - every failure becomes the error envelope
        return error_json(exc, log_stack=log_stack)
    if response is None:  # the client went away
        return Response(status_code=499)
    return JSONResponse(response.model_dump(mode="json"))


@router.get("/v1/models", response_model=ModelList)
async def list_models(raw: Request) -> JSONResponse:
    return JSONResponse(raw.app.state.servings.models.list_models().model_dump(mode="json"))


@router.post("/v1/completions", dependencies=[Depends(validate_json_request)],
             response_model=CompletionResponse, responses=_ERRORS)
async def create_completion(request: CompletionRequest, raw: Request) -> Response:
    """Text completion, as OpenAI's legacy endpoint plus vLLM's extras; SSE with `stream`."""
    return await _serve(raw, raw.app.state.servings.completions, request)


@router.post("/v1/chat/completions", dependencies=[Depends(validate_json_request)],
             response_model=ChatCompletionResponse, responses=_ERRORS)
async def create_chat_completion(request: ChatCompletionRequest, raw: Request) -> Response:
    """Chat completion through the model's chat template; SSE with `stream`."""
    return await _serve(raw, raw.app.state.servings.chat, request)


@router.post("/v1/validate", dependencies=[Depends(validate_json_request)])
async def validate_request(raw: Request) -> JSONResponse:
    """Dry run of a completions or chat body (chat when it has `messages`): the
    `ValidationReport` of every check, generating nothing. Always 200; see `ok` / `error`."""
    try:
        body = await raw.json()
    except ValueError as exc:
        return error_json(ValueError(f"The body is not valid JSON: {exc}"))
    if not isinstance(body, dict):
        return error_json(ValueError("The body must be a JSON object."))
    servings = raw.app.state.servings  # the dry run renders and tokenizes: off the loop
    report = await servings.cpu.run(validate, servings, body, headers=dict(raw.headers))
    return JSONResponse(report.to_dict())
