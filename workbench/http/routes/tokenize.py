"""`/tokenize` and `/detokenize` (not under `/v1`: open even with `--api-key`, as vLLM)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from workbench.http.errors import error_json, validate_json_request
from workbench.serving.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)

router = APIRouter()


@router.post("/tokenize", dependencies=[Depends(validate_json_request)],
             response_model=TokenizeResponse)
async def tokenize(request: TokenizeRequest, raw: Request) -> JSONResponse:
    try:
        serving = raw.app.state.servings.tokenize
        response = await serving.cpu.run(serving.tokenize, request)  # off the event loop
    except Exception as exc:  # noqa: BLE001
        return error_json(exc, log_stack=raw.app.state.server_config.log_error_stack)
    return JSONResponse(response.model_dump(mode="json"))


@router.post("/detokenize", dependencies=[Depends(validate_json_request)],
             response_model=DetokenizeResponse)
async def detokenize(request: DetokenizeRequest, raw: Request) -> JSONResponse:
    try:
        response = raw.app.state.servings.tokenize.detokenize(request)
    except Exception as exc:  # noqa: BLE001
        return error_json(exc, log_stack=raw.app.state.server_config.log_error_stack)
    return JSONResponse(response.model_dump(mode="json"))
