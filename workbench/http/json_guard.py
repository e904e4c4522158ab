"""`JsonGuardMiddleware`: refuses JSON that parses in Python but is not data a request can hold.

Python's `json` accepts `NaN`, `Infinity` and `-Infinity`, turns `1e999` into infinity, keeps
lone UTF-16 surrogates (`"\\ud800"`) as unencodable characters, and recurses once per nesting
level. Every route would have to re-check those; this middleware checks each JSON request body
once, before any route sees it, and answers 400 in the OpenAI error shape naming the location
(`body.temperature`, `body.messages.0.content`); so is a body that is not UTF-8. It parses the
bytes as the routes will (`json.loads` of bytes skips a UTF-8 byte-order mark and would read
UTF-16 or UTF-32), so no prefix hides a body from it. Bodies that do not parse pass through:
the routes refuse those themselves (content type, syntax).
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_DEPTH = 64  # no request field nests anywhere near this deep


class _Bad(Exception):
    def __init__(self, message: str, loc: str | None = None):
        super().__init__(message)
        self.loc = loc


class _NonFinite:
    def __init__(self, text: str):
        self.text = text


def _number(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _check(value: Any) -> None:
    """Walks the parsed body (iteratively): non-finite numbers, lone surrogates, depth."""
    stack: list[tuple[Any, tuple, int]] = [(value, ("body",), 0)]
    while stack:
        item, loc, depth = stack.pop()
        where = ".".join(str(p) for p in loc)
        if depth > MAX_DEPTH:
            raise _Bad(f"{where}: the JSON nests deeper than {MAX_DEPTH} levels.", where)
        if isinstance(item, _NonFinite):
            raise _Bad(f"{where}: {item.text} is not a valid number (JSON numbers must be "
                       "finite).", where)
        if isinstance(item, str):
            _check_text(item, where)
        elif isinstance(item, dict):
            for key, sub in item.items():
                _check_text(key, where)
                stack.append((sub, loc + (key,), depth + 1))
        elif isinstance(item, list):
            stack.extend((sub, loc + (i,), depth + 1) for i, sub in enumerate(item))


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _Bad(f"{where}: the string contains a lone UTF-16 surrogate "
                   f"(\\u{ord(text[exc.start]):04x}), which is not valid Unicode text.",
                   where) from None


def check_json_body(body: bytes) -> None:
    """Raises `_Bad` for a body the routes must never see; non-JSON passes (routes refuse it)."""
    if json.detect_encoding(body) not in ("utf-8", "utf-8-sig"):
        raise _Bad("body: the request body is UTF-16 or UTF-32; JSON must be sent as UTF-8.",
                   "body")
    try:
        text = body.decode("utf-8-sig")  # as json.loads(bytes): a leading BOM is skipped
    except UnicodeDecodeError as exc:
        raise _Bad(f"body: the request body is not valid UTF-8 (byte {exc.start}); JSON must "
                   "be sent as UTF-8.", "body") from None
    try:
        value = json.loads(text, parse_constant=_NonFinite, parse_float=_number)
    except RecursionError:
        raise _Bad(f"body: the JSON nests deeper than {MAX_DEPTH} levels.", "body") from None
    except ValueError:
        return
    _check(value)


class JsonGuardMiddleware:
    """Checks `application/json` request bodies (see the module docstring)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        content_type = b""
        for name, value in scope.get("headers") or []:
            if name == b"content-type":
                content_type = value
        if b"json" not in content_type.lower():
            await self.app(scope, receive, send)
            return
        chunks, more, disconnected = [], True, False
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = True
                break
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        if disconnected:
            return
        body = b"".join(chunks)
        try:
            check_json_body(body)
        except _Bad as bad:
            error = {"message": str(bad), "type": "BadRequestError", "param": bad.loc,
                     "code": 400}
            await JSONResponse({"error": error}, status_code=400)(scope, receive, send)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
