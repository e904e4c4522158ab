"""FastAPI routers, one module per endpoint family: `openai`, `tokenize`, `system`."""

from __future__ import annotations

from fastapi import Request

from workbench.serving.base import RequestMeta


def request_meta(request: Request) -> RequestMeta:
    """The headers a serving object may read (names lower-case)."""
    return RequestMeta(headers={k.lower(): v for k, v in request.headers.items()})
