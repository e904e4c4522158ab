"""`build_app(engine, config)`: the FastAPI application of one OpenAI-compatible server.

Everything the routes need hangs on `app.state` (engine, serving objects, config, a private
Prometheus registry), so several apps coexist in one process. Routes: `routes/openai.py`
(`/v1/models`, `/v1/completions`, `/v1/chat/completions`), `routes/tokenize.py`,
`routes/system.py` (`/health`, `/version`, `/metrics`, `/docs`), `routes/extras.py` (vLLM's
batch chat, `/invocations`, `/load`, `/tokenizer_info`); `/openapi.json` is FastAPI's.
By model kind: an embedding model gets `/v1/models` but no generation routes; the pooling
routes follow the engine's pooling tasks (`routes/pooling.py`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from workbench.http.errors import (
    http_exception_handler,
    request_validation_handler,
    unexpected_error_handler,
)
from workbench.http.json_guard import JsonGuardMiddleware
from workbench.http.middleware import (
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    RequestCounterMiddleware,
)
from workbench.http.routes import (
    extras,
    lora,
    neuronpedia,
    openai,
    pooling,
    responses,
    saes,
    system,
    tokenize,
)
from workbench.http.shutdown import Drain
from workbench.serving import ServerConfig, ServingMetrics, Servings
from workbench.version import __version__


def build_app(engine: Any, config: ServerConfig | None = None, *,
              tool_server: Any = None) -> FastAPI:
    """An app serving `engine` (an `AsyncLLMEngine`) under `config`; `tool_server` (a
    `workbench.tools.ToolServer`) holds the Responses API's built-in tools (default: the
    calculator)."""
    config = config or ServerConfig()
    registry = CollectorRegistry()
    names = config.served_model_names or (engine.served_model_name,)
    metrics = ServingMetrics(registry, names[0], engine)
    app = FastAPI(title="workbench OpenAI-compatible server", version=__version__,
                  docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.engine = engine
    app.state.server_config = config
    app.state.registry = registry
    app.state.servings = Servings.build(engine, config, metrics, tool_server=tool_server)
    app.state.drain = Drain(engine)  # the shutdown deadline of open streams (`shutdown.py`)
    tasks = engine.pooling_tasks
    generates = not engine.is_pooling_model
    for router in (openai.router if generates else pooling.models_only(openai.router),
                   tokenize.router, system.router, *pooling.routers_for(tuple(tasks)),
                   *([responses.router, neuronpedia.router] if generates else [])):
        app.include_router(router)
    if app.state.servings.adapters.allow_runtime:  # VLLM_ALLOW_RUNTIME_LORA_UPDATING
        app.include_router(lora.router)
        if generates:  # SAEs read a decoder's hooks
            app.include_router(saes.router)
    include_extras(app, config, generates, tuple(tasks))
    app.add_exception_handler(RequestValidationError, request_validation_handler)
    app.add_exception_handler(StarletteHTTPException, http_exception_handler)
    app.add_exception_handler(Exception, unexpected_error_handler)
    # outermost last: counting -> API key -> body limit -> JSON guard -> routes
    app.add_middleware(JsonGuardMiddleware)
    app.add_middleware(BodyLimitMiddleware, limit=config.max_request_body_bytes)
    if config.api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=config.api_keys, exempt=config.api_key_exempt)
    app.add_middleware(RequestCounterMiddleware, registry=registry)
    if config.enable_server_load_tracking:
        app.add_middleware(extras.LoadTracking, load=app.state.server_load)
    if config.root_path:  # outermost: every middleware and route sees the prefix
        app.add_middleware(extras.RootPath, root_path=config.root_path)
    apply_engine_limits(engine, config)
    return app


def include_extras(app: FastAPI, config: ServerConfig, generates: bool,
                   tasks: tuple[str, ...]) -> None:
    """vLLM's further routes (`routes/extras.py`): batch chat, /invocations, /load and, when
    enabled, /tokenizer_info; ours, /v1/compare."""
    if generates:
        app.include_router(extras.batch_router)
        app.include_router(extras.compare_router)
    app.state.invocation_types = extras.invocation_types(generates, tasks)
    app.state.server_load = extras.ServerLoad()
    app.include_router(extras.invocations_router)
    app.include_router(extras.load_router)
    if config.enable_tokenizer_info_endpoint:
        app.include_router(extras.tokenizer_info_router)


def apply_engine_limits(engine: Any, config: ServerConfig) -> None:
    """The waiting-queue bound and the request deadline live on the async engine front."""
    for name in ("max_waiting_requests", "request_timeout"):
        if hasattr(engine, name):
            setattr(engine, name, getattr(config, name))
