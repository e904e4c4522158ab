"""`/v1/responses`: create (JSON, or SSE with `event:` lines and no `[DONE]`), retrieve, cancel."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from workbench.http.cancellation import with_cancellation
from workbench.http.errors import error_json, validate_json_request
from workbench.http.routes import request_meta
from workbench.serving.errors import error_response
from workbench.serving.protocol import ErrorResponse
from workbench.serving.protocol.responses import ResponsesRequest, ResponsesResponse

router = APIRouter()
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 500, 501)}


async def _sse(events: AsyncIterator[dict[str, Any]], drain: Any = None) -> AsyncIterator[str]:
    """`event: <type>` and `data: <json>` per event, as the reference (no `[DONE]`); cut at
    the shutdown deadline with an `error` event."""
    async with aclosing(events):
        async for event in events:
            if drain is not None and drain.cutting:
                error = error_response(drain.error()).error
                event = {"type": "error", "code": str(error.code), "message": error.message,
                         "param": None, "sequence_number": event.get("sequence_number")}
                yield f"event: error\ndata: {json.dumps(event)}\n\n"
                return
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


@router.post("/v1/responses", dependencies=[Depends(validate_json_request)],
             response_model=ResponsesResponse, responses=_ERRORS)
async def create_response(request: ResponsesRequest, raw: Request) -> Response:
    """A model response to text or items, with the built-in tool loop; SSE with `stream`."""
    serving = raw.app.state.servings.responses
    meta = request_meta(raw)
    try:
        if request.stream:
            events = await serving.create_stream(request, meta)
            return StreamingResponse(_sse(events, raw.app.state.drain),
                                     media_type="text/event-stream")
        response = await with_cancellation(raw, serving.create(request, meta))
    except Exception as exc:  # noqa: BLE001 - every failure becomes the error envelope
        return error_json(exc, log_stack=raw.app.state.server_config.log_error_stack)
    if response is None:  # the client went away
        return Response(status_code=499)
    return JSONResponse(response.model_dump(mode="json"))


@router.get("/v1/responses/{response_id}", response_model=ResponsesResponse, responses=_ERRORS)
async def retrieve_response(response_id: str, raw: Request, stream: bool | None = None,
                            starting_after: int | None = None) -> Response:
    """A stored response (`store`, the default)."""
    try:
        response = raw.app.state.servings.responses.retrieve(response_id, stream)
    except Exception as exc:  # noqa: BLE001
        return error_json(exc)
    return JSONResponse(response.model_dump(mode="json"))


@router.post("/v1/responses/{response_id}/cancel", response_model=ResponsesResponse,
             responses=_ERRORS)
async def cancel_response(response_id: str, raw: Request) -> Response:
    """Cancels a queued or running background response; a finished one: the reference's 400."""
    try:
        response = await raw.app.state.servings.responses.cancel(response_id)
    except Exception as exc:  # noqa: BLE001
        return error_json(exc)
    return JSONResponse(response.model_dump(mode="json"))
