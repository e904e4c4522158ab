"""ASGI middleware: API-key authentication, the request-body limit, request and error counting.

All are plain ASGI (not `BaseHTTPMiddleware`), so streaming responses and disconnect detection
pass through untouched. Authentication covers every path except the exempt first segments
(`ServerConfig.api_key_exempt`, by default `/health` and `/metrics`, for probes and scrapers)
and CORS preflights; keys are compared as SHA-256 digests with `hmac.compare_digest`, every key
every time (no early exit). A failure is 401 `{"error": "Unauthorized"}`, as vLLM answers.
A body over `max_request_body_bytes` is refused with 413 in the OpenAI error shape, whether it
announces its length or streams in chunks.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from http import HTTPStatus
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workbench.serving.errors import error_response


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8")).digest()


def _path(scope: Scope) -> str:
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class ApiKeyMiddleware:
    """Requires `Authorization: Bearer <key>` (any of `keys`) outside the `exempt` segments;
    `X-SECRET-KEY: <key>` (what Neuronpedia's client sends) is taken as well."""

    def __init__(self, app: ASGIApp, keys: tuple[str, ...], exempt: tuple[str, ...] = ()):
        self.app = app
        self.digests = [_digest(key) for key in keys]
        self.exempt = {segment.strip("/") for segment in exempt}

    def _authorized(self, scope: Scope) -> bool:
        auth = secret = b""
        for name, value in scope.get("headers") or []:
            if name == b"authorization":
                auth = value
            elif name == b"x-secret-key":
                secret = value
        text = auth.decode("latin-1")
        given = _digest(text[7:] if text.startswith("Bearer ") else
                        secret.decode("latin-1") if secret else "\x00no key")
        ok = False
        for digest in self.digests:  # no short-circuit: the time does not depend on which key
            ok |= hmac.compare_digest(given, digest)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("method") == "OPTIONS"
                or _path(scope).strip("/").split("/", 1)[0] in self.exempt
                or self._authorized(scope)):
            await self.app(scope, receive, send)
            return
        await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


def too_large_body(limit: int) -> dict[str, Any]:
    message = (f"The request body is larger than the server's limit of {limit} bytes "
               "(--max-request-body-bytes).")
    return {"error": {"message": message, "type": "RequestEntityTooLarge", "param": None,
                      "code": int(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)}}


class BodyLimitMiddleware:
    """413 for bodies over `limit` bytes: by `Content-Length` up front, else while reading."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refuse = JSONResponse(too_large_body(self.limit), status_code=413,
                              headers={"Connection": "close"})
        for name, value in scope.get("headers") or []:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0:
                    await JSONResponse({"error": {
                        "message": "The Content-Length header is not a non-negative integer.",
                        "type": "BadRequestError", "param": None, "code": 400}},
                        status_code=400)(scope, receive, send)
                    return
                if declared > self.limit:
                    await _drain(receive, declared)
                    await refuse(scope, receive, send)
                    return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _BodyTooLarge
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except _BodyTooLarge:
            if not started:
                await _drain(receive, _DRAIN_CAP)
                await refuse(scope, receive, send)


_DRAIN_CAP = 64 * 2**20  # past this much, stop reading: the connection closes instead


async def _drain(receive: Receive, cap: int) -> None:
    """Reads (and drops) the rest of a refused body, so the client sees the 413 rather than a
    reset connection; gives up after `cap` bytes."""
    read = 0
    while read <= min(cap, _DRAIN_CAP):
        message = await receive()
        if message["type"] != "http.request":
            return
        read += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class RequestCounterMiddleware:
    """Counts HTTP requests by method, route template and status, and error responses by
    status and error type (`workbench:request_errors`), in the app's registry."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry):
        self.app = app
        self.counter = Counter("http_requests", "HTTP requests by method, handler and status.",
                               ["method", "handler", "status"], registry=registry)
        self.errors = Counter("workbench:request_errors",
                              "Error responses by HTTP status and error type (the `type` of "
                              "the OpenAI error body; in-stream errors count as status 200).",
                              ["status", "type"], registry=registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: dict[str, Any] = {"code": 500, "body": b"", "sse": False, "started": False}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["started"] = message["status"], True
                headers = dict(message.get("headers") or [])
                status["sse"] = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if status["code"] >= 400 and len(status["body"]) < 65536:
                    status["body"] += body
                elif status["sse"] and b'data: {"error"' in body:
                    self.errors.labels("200", _error_type(body.split(b"data: ", 1)[1])).inc()
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except Exception as exc:  # the app's generic handler answers outside this middleware
            if not status["started"]:
                answer = error_response(exc, quiet=True).error
                status["code"], status["body"] = answer.code, json.dumps(
                    {"error": {"type": answer.type}}).encode()
            raise
        finally:
            route = scope.get("route")
            handler = getattr(route, "path", None) or "unmatched"
            self.counter.labels(scope.get("method", ""), handler, str(status["code"])).inc()
            if status["code"] >= 400:
                self.errors.labels(str(status["code"]), _error_type(status["body"])).inc()


def _error_type(body: bytes) -> str:
    """The `error.type` of an error body (`"Unauthorized"` for the 401 shape, else unknown)."""
    try:
        error = json.loads(body.decode("utf-8", "replace").strip().split("\n", 1)[0])["error"]
    except (ValueError, KeyError, TypeError, IndexError):
        return "unknown"
    if isinstance(error, dict):
        return str(error.get("type") or "unknown")[:64]
    return str(error)[:64]
