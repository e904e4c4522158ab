"""`serve_in_kernel(llm)`: the notebook's own engine over HTTP, from a background thread.

uvicorn runs with its own event loop in a daemon thread of the current process, so it works
inside a running Jupyter kernel (whose loop stays free). The socket is bound before the thread
starts, so `port=0` picks a free port and `handle.url` is known at once; `handle.stop()` stops
accepting, lets in-flight requests finish (`ServerConfig.shutdown_timeout`), then frees the
port. The `LLM` keeps working synchronously meanwhile: both submit to the same engine.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from workbench.engine.async_engine import AsyncLLMEngine
from workbench.http.app import build_app
from workbench.http.protocol import uvicorn_config
from workbench.http.shutdown import DrainingServer
from workbench.serving.config import ServerConfig


@dataclass
class KernelServer:
    """A running in-process server: `url` (`base_url` adds `/v1`), `stop()`; a context manager."""

    url: str
    host: str
    port: int
    app: Any
    engine: Any
    _server: Any = field(repr=False)
    _thread: threading.Thread = field(repr=False)
    _sock: socket.socket = field(repr=False)
    _owns_engine: bool = field(default=True, repr=False)

    @property
    def base_url(self) -> str:
        """What the `openai` client takes: `OpenAI(base_url=server.base_url, api_key=...)`."""
        return f"{self.url}/v1"

    def stop(self, timeout: float | None = None) -> None:
        """Stops accepting at once; in-flight requests get `timeout` seconds (default: the
        config's `shutdown_timeout`) to finish, then open streams end with an error event and
        `[DONE]` (engine requests aborted, blocks freed); the port is freed."""
        grace = self.app.state.server_config.shutdown_timeout if timeout is None else timeout
        self._server.set_timeout(grace)
        self._server.should_exit = True
        self._thread.join(grace + 10)
        self._sock.close()
        self.app.state.servings.close()
        if self._owns_engine:
            self.engine.shutdown()  # stops this wrapper's step thread, not the LLM's engine

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> "KernelServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"KernelServer(url={self.url!r}, running={self.running})"


def serve_in_kernel(llm: Any, port: int = 0, host: str = "127.0.0.1",
                    config: ServerConfig | None = None, *, tool_server: Any = None,
                    **config_kwargs: Any) -> KernelServer:
    """Serves `llm` (a `workbench.LLM`, or an `AsyncLLMEngine`) at http://host:port/v1;
    `tool_server`: the Responses API's built-in tools (default: the calculator)."""
    owns_engine = not isinstance(llm, AsyncLLMEngine)
    engine = AsyncLLMEngine.from_llm(llm) if owns_engine else llm
    config = config or ServerConfig(**config_kwargs)
    app = build_app(engine, config, tool_server=tool_server)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    bound_port = sock.getsockname()[1]
    server = DrainingServer(uvicorn_config(app, log_level="warning", access_log=False),
                            app.state.drain, config.shutdown_timeout)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name=f"workbench-server-{bound_port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        sock.close()
        raise RuntimeError(f"the server on {host}:{bound_port} did not start")
    return KernelServer(url=f"http://{host}:{bound_port}", host=host, port=bound_port, app=app,
                        engine=engine, _server=server, _thread=thread, _sock=sock,
                        _owns_engine=owns_engine)
