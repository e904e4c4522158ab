"""vLLM's further routes: `/v1/chat/completions/batch`, `/invocations` (SageMaker), `/load`
and `/tokenizer_info` (with `--enable-tokenizer-info-endpoint`); and ours, `/v1/compare` (a
workbench extension: one text through several variants of the model, `serving/compare.py`).

`/invocations` tries the body as each request type the model serves, in vLLM's order (chat,
completion; embeddings, classify, rerank, score, pooling) and answers as the first that
validates; a type whose own checks refuse the body answers with that refusal (vLLM's checks
raise past pydantic: a body with neither `messages` nor `prompt` gets the completion's "Either
prompt or prompt_embeds must be provided..."); none -> 400 "Cannot find suitable handler for
request. Expected one of: [...]".
`/load` reports the requests in flight on the inference routes (`LoadTracking`; counted only
with `--enable-server-load-tracking`, else 0, as vLLM).
"""

from __future__ import annotations

from typing import Any

import pydantic
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from workbench.errors import ValidationError
from workbench.http.cancellation import with_cancellation
from workbench.http.errors import error_json, validate_error_json, validate_json_request
from workbench.http.routes import openai, pooling, request_meta
from workbench.serving.chat_batch import BatchChatCompletionRequest, create_batch
from workbench.serving.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
)
from workbench.serving.protocol.compare import CompareRequest
from workbench.serving.protocol.pooling import (
    ClassificationRequest,
    EmbeddingRequest,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)

batch_router = APIRouter()
invocations_router = APIRouter()
load_router = APIRouter()
tokenizer_info_router = APIRouter()
compare_router = APIRouter()

# the routes vLLM's `load_aware_call` counts
LOAD_TRACKED = ("/v1/responses", "/v1/chat/completions", "/v1/chat/completions/batch",
                "/v1/completions", "/v1/embeddings",
                "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank",
                "/v2/rerank", "/invocations", "/v1/compare")


@batch_router.post("/v1/chat/completions/batch", dependencies=[Depends(validate_json_request)],
                   response_model=ChatCompletionResponse)
async def create_batch_chat_completion(request: BatchChatCompletionRequest,
                                       raw: Request) -> Response:
    """N conversations (`messages: list[list[message]]`), one choice each; no streaming."""
    try:
        response = await with_cancellation(
            raw, create_batch(raw.app.state.servings.chat, request, request_meta(raw)))
    except pydantic.ValidationError as exc:  # a conversation's own fields
        return validate_error_json(exc)
    except Exception as exc:  # noqa: BLE001 - every failure becomes the error envelope
        return error_json(exc, log_stack=raw.app.state.server_config.log_error_stack)
    if response is None:  # the client went away
        return Response(status_code=499)
    return JSONResponse(response.model_dump(mode="json"))


@compare_router.post("/v1/compare", dependencies=[Depends(validate_json_request)])
async def compare(request: CompareRequest, raw: Request) -> Response:
    """Ours: `text` after `prompt` teacher-forced through each variant (base, adapters,
    interventions) in one batch; per token logprobs, their differences and exact KL."""
    try:
        body = await with_cancellation(
            raw, raw.app.state.servings.compare.create(request, request_meta(raw)))
    except Exception as exc:  # noqa: BLE001 - every failure becomes the error envelope
        return error_json(exc, log_stack=raw.app.state.server_config.log_error_stack)
    if body is None:  # the client went away
        return Response(status_code=499)
    return JSONResponse(body)


def invocation_types(generates: bool, tasks: tuple[str, ...]) -> list[tuple[Any, str, Any]]:
    """(request type, its name, serve function) in vLLM's order for this model."""
    types: list[tuple[Any, str, Any]] = []
    if generates:
        types += [(ChatCompletionRequest, "ChatCompletionRequest", lambda raw, r: openai._serve(
                      raw, raw.app.state.servings.chat, r)),
                  (CompletionRequest, "CompletionRequest", lambda raw, r: openai._serve(
                      raw, raw.app.state.servings.completions, r))]
    pooled = {"embed": (EmbeddingRequest, "EmbeddingRequest", "embeddings"),
              "classify": (ClassificationRequest, "ClassificationRequest", "classify")}
    for task, (kind, name, attr) in pooled.items():
        if task in tasks:
            types.append((kind, name, _pooling(attr)))
    if "score" in tasks:
        types += [(RerankRequest, "RerankRequest", _pooling("rerank")),
                  (ScoreRequest, "ScoreRequest", _pooling("score"))]
    if tasks:
        types.append((PoolingRequest, "PoolingRequest", _pooling("pooling")))
    return types


def _pooling(attr: str):
    return lambda raw, request: pooling._serve(raw, getattr(raw.app.state.servings, attr),
                                               request)


@invocations_router.post("/invocations", dependencies=[Depends(validate_json_request)])
async def invocations(raw: Request) -> Response:
    """SageMaker's single route: the body as the first request type that validates."""
    try:
        body = await raw.json()
    except ValueError as exc:
        return error_json(ValueError(f"JSON decode error: {exc}"))
    types = raw.app.state.invocation_types
    for kind, _, serve in types:
        try:
            request = pydantic.TypeAdapter(kind).validate_python(body)
        except pydantic.ValidationError as exc:
            check = _failed_check(exc)
            if check is not None:  # vLLM's checks raise past pydantic there: that answer
                return error_json(check)
            continue
        return await serve(raw, request)
    names = [name for _, name, _ in types]
    return error_json(ValueError(
        f"Cannot find suitable handler for request. Expected one of: {names}"))


def _failed_check(exc: pydantic.ValidationError) -> ValidationError | None:
    """One of vLLM's request checks (run before the schema) that refused the body, if any."""
    for error in exc.errors():
        check = (error.get("ctx") or {}).get("error")
        if isinstance(check, ValidationError):
            return check
    return None


@load_router.get("/load")
async def load(raw: Request) -> JSONResponse:
    """`{"server_load": N}`: inference requests in flight (0 without load tracking)."""
    load = getattr(raw.app.state, "server_load", None)
    return JSONResponse({"server_load": load.in_flight if load is not None else 0})


@tokenizer_info_router.get("/tokenizer_info")
async def tokenizer_info(raw: Request) -> JSONResponse:
    """The tokenizer's init kwargs (file paths left out), its class and the chat template."""
    engine, config = raw.app.state.engine, raw.app.state.server_config
    tokenizer = engine.tokenizer
    info = {key: _plain(value) for key, value in
            dict(getattr(tokenizer, "init_kwargs", None) or {}).items()
            if key not in ("vocab_file", "merges_file", "tokenizer_file", "name_or_path")}
    info["tokenizer_class"] = type(tokenizer).__name__
    template = config.chat_template or getattr(tokenizer, "chat_template", None)
    if template:
        info["chat_template"] = template
    return JSONResponse(info)


def _plain(value: Any) -> Any:
    """JSON-able: added tokens as their text, containers walked (vLLM's serializer)."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


class ServerLoad:
    """Inference requests in flight (`app.state.server_load`), kept by `LoadTracking`."""

    def __init__(self) -> None:
        self.in_flight = 0


class LoadTracking:
    """ASGI middleware counting requests on `LOAD_TRACKED` paths into a `ServerLoad`, from
    the request until its last response byte (a stream counts while it streams)."""

    def __init__(self, app: ASGIApp, load: ServerLoad):
        self.app = app
        self.load = load

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        if scope["type"] != "http" or path not in LOAD_TRACKED:
            await self.app(scope, receive, send)
            return
        self.load.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.load.in_flight -= 1


class RootPath:
    """`--root-path`: the prefix of a proxy in front. Sets the ASGI `root_path`, so a route
    answers at `/prefix/v1/...` (the proxy passed the path on) and at `/v1/...` (it stripped
    it), as vLLM's `FastAPI(root_path=...)`."""

    def __init__(self, app: ASGIApp, root_path: str):
        self.app = app
        self.root_path = root_path.rstrip("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, "root_path": self.root_path}
        await self.app(scope, receive, send)
