"""Neuronpedia's inference routes under `/v1` (`workbench.serving.neuronpedia`), as
`neuronpedia-inference-client` calls them: `Configuration(host=".../v1")`, and with `--api-key`
the key in its `X-SECRET-KEY` header (`middleware.ApiKeyMiddleware` takes either header).

Bodies are read as that server's schema reads them: a body the schema rejects is a 422 with
FastAPI's `{"detail": [...]}` naming the field; a refused request `{"error": message}`
(`NeuronpediaError`'s status, or the status of the engine's own refusal)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pydantic
from fastapi import APIRouter, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response, StreamingResponse

from workbench.serving import error_response
from workbench.serving.neuronpedia import NeuronpediaError, NeuronpediaServing
from workbench.serving.protocol import neuronpedia as np

router = APIRouter()
logger = logging.getLogger("workbench.neuronpedia")

Method = Callable[[NeuronpediaServing, Any], Any]
ROUTES: dict[str, tuple[type[pydantic.BaseModel], Method]] = {
    "activation/all": (np.ActivationAllRequest, NeuronpediaServing.activation_all),
    "activation/all-batch": (np.ActivationAllBatchRequest,
                             NeuronpediaServing.activation_all_batch),
    "activation/single": (np.ActivationSingleRequest, NeuronpediaServing.activation_single),
    "activation/single-batch": (np.ActivationSingleBatchRequest,
                                NeuronpediaServing.activation_single_batch),
    "activation/topk-by-token": (np.ActivationTopkByTokenRequest,
                                 NeuronpediaServing.topk_by_token),
    "activation/topk-by-token-batch": (np.ActivationTopkByTokenBatchRequest,
                                       NeuronpediaServing.topk_by_token_batch),
    "steer/completion": (np.SteerCompletionRequest, NeuronpediaServing.steer_completion),
    "steer/completion-chat": (np.SteerCompletionChatRequest,
                              NeuronpediaServing.steer_completion_chat),
    "tokenize": (np.NPTokenizeRequest, NeuronpediaServing.tokenize),
    "util/sae-vector": (np.UtilSaeVectorRequest, NeuronpediaServing.sae_vector),
    "util/sae-topk-by-decoder-cossim": (np.UtilSaeTopkByDecoderCossimRequest,
                                        NeuronpediaServing.topk_by_decoder_cossim),
}


def error(exc: BaseException) -> JSONResponse:
    """Neuronpedia's error shape, `{"error": message}`, with the refusal's status."""
    if isinstance(exc, NeuronpediaError):
        return JSONResponse({"error": str(exc)}, status_code=exc.status)
    body = error_response(exc).error  # the engine's own refusals keep their status
    return JSONResponse({"error": body.message}, status_code=body.code)


def route(path: str, schema: type[pydantic.BaseModel], method: Method
          ) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(raw: Request) -> Response:
        try:
            request = schema.model_validate(json.loads(await raw.body()))
        except json.JSONDecodeError as exc:
            return JSONResponse({"detail": [{"type": "json_invalid", "loc": ["body", exc.pos],
                                             "msg": "JSON decode error", "input": {}}]},
                                status_code=422)
        except pydantic.ValidationError as exc:
            return JSONResponse({"detail": jsonable_encoder(
                [{**e, "loc": ["body", *e["loc"]]} for e in exc.errors(include_url=False)])},
                status_code=422)
        try:
            result = method(raw.app.state.servings.neuronpedia, request)
            if isinstance(result, Awaitable):
                result = await result
        except Exception as exc:  # noqa: BLE001 - every failure answers in its shape
            return error(exc)
        if isinstance(result, AsyncIterator):
            return StreamingResponse(events(result), media_type="text/event-stream")
        return JSONResponse(result)

    endpoint.__name__ = "neuronpedia_" + path.replace("/", "_").replace("-", "_")
    return endpoint


async def events(frames: AsyncIterator[str]) -> AsyncIterator[str]:
    """The stream's frames; a failure mid-stream ends it with an `{"error": ...}` event."""
    try:
        async for frame in frames:
            yield frame
    except Exception as exc:  # noqa: BLE001
        logger.exception("A Neuronpedia stream failed")
        yield "data: " + json.dumps({"error": json.loads(error(exc).body)["error"]}) + "\n\n"


for _path, (_schema, _method) in ROUTES.items():
    router.add_api_route(f"/v1/{_path}", route(_path, _schema, _method), methods=["POST"],
                         summary=f"Neuronpedia's {_path}")
