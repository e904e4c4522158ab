"""ASGI middleware: API-key authentication and per-route request counting.

Both are plain ASGI (not `BaseHTTPMiddleware`), so streaming responses and disconnect
detection pass through untouched. Authentication covers paths under `/v1` only, as vLLM's
(`/tokenize`, `/health`, `/metrics` stay open); a failure is 401 `{"error": "Unauthorized"}`.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_PROTECTED = ("/v1",)


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8")).digest()


class ApiKeyMiddleware:
    """Requires `Authorization: Bearer <key>` on `/v1...` for any of `keys`."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...]):
        self.app = app
        self.digests = [_digest(key) for key in keys]

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        given = _digest(auth.removeprefix("Bearer ")) if auth.startswith("Bearer ") else b""
        return any(hmac.compare_digest(given, d) for d in self.digests)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        if (scope["type"] != "http" or scope.get("method") == "OPTIONS"
                or not path.startswith(_PROTECTED) or self._authorized(scope)):
            await self.app(scope, receive, send)
            return
        await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)


class RequestCounterMiddleware:
    """Counts HTTP requests by method, route template and status in the app's registry."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry):
        self.app = app
        self.counter = Counter("http_requests", "HTTP requests by method, handler and status.",
                               ["method", "handler", "status"], registry=registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: dict[str, Any] = {"code": 500}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            handler = getattr(route, "path", None) or "unmatched"
            self.counter.labels(scope.get("method", ""), handler, str(status["code"])).inc()
