"""`run_server`: load the engine, build the app, serve it with uvicorn until told to stop.

SIGTERM / SIGINT (uvicorn's handlers) stop accepting connections at once, give in-flight
requests `ServerConfig.shutdown_timeout` seconds to finish, then end the rest: open streams
get an error event and `[DONE]`, engine requests are aborted and their blocks freed
(`shutdown.py`). If the engine loop dies, the server stops too and
`run_server` returns 1, so `workbench serve` exits non-zero and a supervisor can restart it.
"""

from __future__ import annotations

import logging
from typing import Any

from workbench.config import EngineConfig
from workbench.engine.async_engine import AsyncLLMEngine
from workbench.http.app import build_app
from workbench.http.protocol import uvicorn_config
from workbench.http.shutdown import DrainingServer, exit_now
from workbench.serving.config import ServerConfig

logger = logging.getLogger("workbench.http")


def run_server(engine_config: EngineConfig, server_config: ServerConfig, *,
               host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
               **uvicorn_kwargs: Any) -> int:
    """Blocks serving `engine_config.model`; 0 after a normal shutdown, 1 if the engine died."""
    engine = AsyncLLMEngine.from_config(engine_config)
    try:
        if engine.generation_defaults:
            logger.warning("Default sampling parameters come from the model's generation "
                           "config: %s", engine.generation_defaults)
        names = server_config.served_model_names or (engine.served_model_name,)
        logger.info("Serving %s (max_model_len=%d) on http://%s:%d/v1", ", ".join(names),
                    engine.max_model_len, host, port)
        return serve_engine(engine, server_config, host=host, port=port, log_level=log_level,
                            **uvicorn_kwargs)
    finally:
        engine.shutdown()


def serve_engine(engine: Any, server_config: ServerConfig, *, host: str, port: int,
                 log_level: str = "info", **uvicorn_kwargs: Any) -> int:
    """Serves an `AsyncLLMEngine` until a signal or its death; returns the exit status."""
    app = build_app(engine, server_config)
    config = uvicorn_config(app, host=host, port=port, log_level=log_level, **uvicorn_kwargs)
    server = DrainingServer(config, app.state.drain, server_config.shutdown_timeout)
    died: list[BaseException] = []

    def on_dead(exc: BaseException) -> None:
        died.append(exc)
        logger.critical("The engine loop died (%r); shutting the server down.", exc)
        server.should_exit = True

    engine.on_dead = on_dead
    try:
        server.run()
    finally:
        app.state.servings.close()
    status = 1 if died else 0
    if server.signalled:  # SIGTERM / SIGINT: the process ends now, within the deadline
        engine.shutdown()
        exit_now(status)
    return status
