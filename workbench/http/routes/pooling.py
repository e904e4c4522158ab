"""Pooling routes, registered by what the model can do (as the reference's per-task routers):
`embed` -> `/v1/embeddings`; any pooling task -> `/pooling`; `classify` -> `/classify`;
`score` -> `/score`, `/v1/score`, `/rerank`, `/v1/rerank`, `/v2/rerank` (`routers_for`)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from workbench.http.cancellation import with_cancellation
from workbench.http.errors import error_json, validate_json_request
from workbench.http.routes import request_meta
from workbench.serving.protocol import ErrorResponse
from workbench.serving.protocol.pooling import (
    ClassificationRequest,
    ClassificationResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingRequest,
    PoolingResponse,
    RerankRequest,
    RerankResponse,
    ScoreRequest,
    ScoreResponse,
)

logger = logging.getLogger("workbench.http")
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 500, 501)}
_JSON = [Depends(validate_json_request)]

embed_router = APIRouter()
pooling_router = APIRouter()
classify_router = APIRouter()
score_router = APIRouter()


async def _serve(raw: Request, serving: Any, request: Any) -> Response:
    try:
        response = await with_cancellation(raw, serving.create(request, request_meta(raw)))
    except Exception as exc:  # noqa: BLE001 - every failure becomes the error envelope
        return error_json(exc, log_stack=raw.app.state.server_config.log_error_stack)
    if response is None:  # the client went away
        return Response(status_code=499)
    return JSONResponse(response.model_dump(mode="json"))


@embed_router.post("/v1/embeddings", dependencies=_JSON, response_model=EmbeddingResponse,
                   responses=_ERRORS)
async def create_embedding(request: EmbeddingRequest, raw: Request) -> Response:
    """Embeddings of texts, token ids or chat messages; floats or base64."""
    return await _serve(raw, raw.app.state.servings.embeddings, request)


@pooling_router.post("/pooling", dependencies=_JSON, response_model=PoolingResponse,
                     responses=_ERRORS)
async def create_pooling(request: PoolingRequest, raw: Request) -> Response:
    """The pooler's raw output for a task (`embed`, `classify`, `score`, `encode`)."""
    return await _serve(raw, raw.app.state.servings.pooling, request)


@classify_router.post("/classify", dependencies=_JSON, response_model=ClassificationResponse,
                      responses=_ERRORS)
async def create_classify(request: ClassificationRequest, raw: Request) -> Response:
    """Label probabilities (label tokens on a generative model)."""
    return await _serve(raw, raw.app.state.servings.classify, request)


@score_router.post("/score", dependencies=_JSON, response_model=ScoreResponse,
                   responses=_ERRORS)
async def create_score(request: ScoreRequest, raw: Request) -> Response:
    """Scores of text pairs: 1:1, 1:N or N:N."""
    return await _serve(raw, raw.app.state.servings.score, request)


@score_router.post("/v1/score", dependencies=_JSON, response_model=ScoreResponse,
                   responses=_ERRORS, include_in_schema=False)
async def create_score_v1(request: ScoreRequest, raw: Request) -> Response:
    logger.warning("To indicate that Score API is not part of standard OpenAI API, we have "
                   "moved it to `/score`. Please update your client accordingly.")
    return await _serve(raw, raw.app.state.servings.score, request)


@score_router.post("/rerank", dependencies=_JSON, response_model=RerankResponse,
                   responses=_ERRORS)
async def do_rerank(request: RerankRequest, raw: Request) -> Response:
    """Documents ranked by relevance to a query, best first."""
    return await _serve(raw, raw.app.state.servings.rerank, request)


@score_router.post("/v1/rerank", dependencies=_JSON, response_model=RerankResponse,
                   responses=_ERRORS, include_in_schema=False)
async def do_rerank_v1(request: RerankRequest, raw: Request) -> Response:
    logger.warning("To indicate that the rerank API is not part of the standard OpenAI API, we "
                   "have located it at `/rerank`. Please update your client accordingly. "
                   "(Note: Conforms to JinaAI rerank API)")
    return await _serve(raw, raw.app.state.servings.rerank, request)


@score_router.post("/v2/rerank", dependencies=_JSON, response_model=RerankResponse,
                   responses=_ERRORS)
async def do_rerank_v2(request: RerankRequest, raw: Request) -> Response:
    return await _serve(raw, raw.app.state.servings.rerank, request)


def routers_for(tasks: tuple[str, ...]) -> list[APIRouter]:
    """The pooling routers a model with these pooling tasks gets."""
    routers = []
    if "embed" in tasks:
        routers.append(embed_router)
    if tasks:
        routers.append(pooling_router)
    if "classify" in tasks:
        routers.append(classify_router)
    if "score" in tasks:
        routers.append(score_router)
    return routers


def models_only(router: APIRouter) -> APIRouter:
    """What a model that cannot generate keeps of the OpenAI router: `/v1/models` (the
    reference registers completions and chat only for generating models: they answer 404)."""
    kept = APIRouter()
    kept.routes.extend(r for r in router.routes if getattr(r, "path", None) == "/v1/models")
    return kept

