"""Server-sent events as the reference writes them: `data: <json>\\n\\n`, then `data: [DONE]`.

At the shutdown deadline (`shutdown.Drain.cut`) an open stream sends one error event and
`[DONE]` instead of the rest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi.responses import StreamingResponse

from workbench.serving.errors import error_response
from workbench.serving.streaming import error_json


async def sse_events(payloads: AsyncIterator[str], drain: Any = None) -> AsyncIterator[str]:
    """Frames each JSON payload; `[DONE]` closes every stream that ran to its end or was cut."""
    async with aclosing(payloads):
        async for payload in payloads:
            if drain is not None and drain.cutting:
                break
            yield f"data: {payload}\n\n"
    if drain is not None and drain.cutting:
        yield f"data: {error_json(error_response(drain.error()))}\n\n"
    yield "data: [DONE]\n\n"


def sse_response(payloads: AsyncIterator[str], drain: Any = None) -> StreamingResponse:
    return StreamingResponse(sse_events(payloads, drain), media_type="text/event-stream")
