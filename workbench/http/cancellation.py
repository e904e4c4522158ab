"""Client disconnects cancel the handler, which aborts its engine requests.

`with_cancellation` runs a handler coroutine while watching the connection; when the client
goes first, the handler task is cancelled (its engine streams then abort their requests) and
None is returned. Streaming responses are covered by Starlette, which cancels the stream on
disconnect. A handler that ends after the shutdown deadline (`shutdown.py`) raises the 503
that says so, instead of answering with the requests it aborted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

T = TypeVar("T")


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def with_cancellation(request: Request, handler: Awaitable[T]) -> T | None:
    handler_task = asyncio.ensure_future(handler)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({handler_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this server is shutting down: the handler goes too
        handler_task.cancel()
        raise
    finally:
        watcher.cancel()
    if not handler_task.done():  # the client left: cancel, and let the handler's aborts run
        handler_task.cancel()
        await asyncio.wait({handler_task})
    if handler_task.cancelled():
        return None
    result = handler_task.result()
    drain = getattr(request.app.state, "drain", None)
    if drain is not None and drain.cutting:  # aborted at the shutdown deadline: no answer
        raise drain.error()
    return result
