"""Graceful shutdown with a deadline: streams still open at `--shutdown-timeout` end cleanly.

On SIGTERM (or `KernelServer.stop`) uvicorn stops accepting and waits for open connections.
`DrainingServer` arms a timer for `shutdown_timeout` seconds; when it fires, `Drain.cut` aborts
every engine request of this server, and each open SSE stream, at its next event, sends one
error event (503, "the server is shutting down") and `[DONE]` instead of the rest (a Responses
stream: an `error` event). uvicorn itself waits `CUT_GRACE` seconds more before it cancels what
is left, so the cut streams flush and their connections close: no transport-level cut, no
`CancelledError` in the log, and the process exits within the timeout plus about a second
(`exit_now`: after a signal, interpreter teardown is skipped).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

import uvicorn

from workbench.engine.protocol import EngineClient
from workbench.errors import ServiceUnavailableError

logger = logging.getLogger("workbench.http")
CUT_GRACE = 1.0  # seconds between the cut and uvicorn's own cancellation (a backstop)


class Drain:
    """One app's shutdown state: `cut` once the deadline has passed."""

    def __init__(self, engine: EngineClient):
        self.engine = engine
        self.cutting = False

    def cut(self) -> None:
        """Ends every open stream at its next event and aborts the engine's requests."""
        if self.cutting:
            return
        self.cutting = True
        logger.warning("Shutdown deadline reached: ending the open streams with an error.")
        self.engine.abort_all()

    @staticmethod
    def error() -> ServiceUnavailableError:
        return ServiceUnavailableError("The server is shutting down: this stream was ended at "
                                       "the --shutdown-timeout deadline.")


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the deadline of `Drain`; exits with status 0 after a SIGTERM
    drain (uvicorn re-raises the signal once shut down, which a supervisor reads as a crash)."""

    def __init__(self, config: uvicorn.Config, drain: Drain | None, shutdown_timeout: float):
        super().__init__(config)
        self.drain = drain
        self.set_timeout(shutdown_timeout)

    def set_timeout(self, seconds: float) -> None:
        """The deadline of open streams; uvicorn's own cancellation comes `CUT_GRACE` later."""
        self.shutdown_timeout = seconds
        self.config.timeout_graceful_shutdown = seconds + CUT_GRACE

    signalled = False  # stopped by SIGTERM / SIGINT (not by `should_exit` from code)

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        self.signalled = True
        if hasattr(self, "_captured_signals"):
            self._captured_signals.clear()

    async def shutdown(self, sockets: Any = None) -> None:
        timer = None
        if self.drain is not None:
            timer = asyncio.get_running_loop().call_later(self.shutdown_timeout, self.drain.cut)
        try:
            await super().shutdown(sockets)
        finally:
            if timer is not None:
                timer.cancel()


def exit_now(status: int) -> None:
    """Ends the process at once after a signal-driven shutdown: logs and streams flushed,
    interpreter teardown (seconds with torch loaded) skipped, so the exit comes within the
    shutdown deadline plus a second."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)
