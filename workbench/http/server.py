"""`run_server`: load the engine, build the app, serve it with uvicorn until interrupted."""

from __future__ import annotations

import logging
from typing import Any

from workbench.config import EngineConfig
from workbench.serving.config import ServerConfig

logger = logging.getLogger("workbench.http")


def run_server(engine_config: EngineConfig, server_config: ServerConfig, *,
               host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
               **uvicorn_kwargs: Any) -> None:
    """Blocks serving `engine_config.model`; shuts the engine down when uvicorn returns."""
    import uvicorn

    from workbench.engine.async_engine import AsyncLLMEngine
    from workbench.http.app import build_app

    engine = AsyncLLMEngine.from_config(engine_config)
    try:
        if engine.generation_defaults:
            logger.warning("Default sampling parameters come from the model's generation "
                           "config: %s", engine.generation_defaults)
        app = build_app(engine, server_config)
        names = server_config.served_model_names or (engine.served_model_name,)
        logger.info("Serving %s (max_model_len=%d) on http://%s:%d/v1", ", ".join(names),
                    engine.max_model_len, host, port)
        uvicorn.run(app, host=host, port=port, log_level=log_level, **uvicorn_kwargs)
    finally:
        engine.shutdown()
