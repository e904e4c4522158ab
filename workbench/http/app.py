"""`build_app(engine, config)`: the FastAPI application of one OpenAI-compatible server.

Everything the routes need hangs on `app.state` (engine, serving objects, config, a private
Prometheus registry), so several apps coexist in one process. Routes: `routes/openai.py`
(`/v1/models`, `/v1/completions`, `/v1/chat/completions`), `routes/tokenize.py`,
`routes/system.py` (`/health`, `/version`, `/metrics`, `/docs`); `/openapi.json` is FastAPI's.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from workbench.http.errors import (
    http_exception_handler, request_validation_handler, unexpected_error_handler,
)
from workbench.http.middleware import ApiKeyMiddleware, RequestCounterMiddleware
from workbench.http.routes import openai, responses, system, tokenize
from workbench.serving import ServerConfig, ServingMetrics, Servings


def build_app(engine: Any, config: ServerConfig | None = None) -> FastAPI:
    """An app serving `engine` (an `AsyncLLMEngine`) under `config`."""
    import workbench

    config = config or ServerConfig()
    registry = CollectorRegistry()
    names = config.served_model_names or (engine.served_model_name,)
    metrics = ServingMetrics(registry, names[0], engine)
    app = FastAPI(title="workbench OpenAI-compatible server", version=workbench.__version__,
                  docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.engine = engine
    app.state.server_config = config
    app.state.registry = registry
    app.state.servings = Servings.build(engine, config, metrics)
    for router in (openai.router, tokenize.router, system.router, responses.router):
        app.include_router(router)
    app.add_exception_handler(RequestValidationError, request_validation_handler)
    app.add_exception_handler(StarletteHTTPException, http_exception_handler)
    app.add_exception_handler(Exception, unexpected_error_handler)
    app.add_middleware(RequestCounterMiddleware, registry=registry)
    if config.api_keys:
        app.add_middleware(ApiKeyMiddleware, keys=config.api_keys)
    return app
