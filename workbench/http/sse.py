"""Server-sent events as the reference writes them: `data: <json>\\n\\n`, then `data: [DONE]`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi.responses import StreamingResponse


async def sse_events(payloads: AsyncIterator[str]) -> AsyncIterator[str]:
    """Frames each JSON payload; `[DONE]` closes every stream that ran to its end."""
    async with aclosing(payloads):
        async for payload in payloads:
            yield f"data: {payload}\n\n"
    yield "data: [DONE]\n\n"


def sse_response(payloads: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(sse_events(payloads), media_type="text/event-stream")
