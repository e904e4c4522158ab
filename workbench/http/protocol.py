"""HTTP/1.1 with header limits: a request head past them gets 431, answered gracefully.

uvicorn's h11 protocol refuses a head past h11's 16 KiB buffer with a bare 400 and closes the
socket while the client is still sending, so the kernel resets the connection and the client
reads neither status nor body. `LimitedH11Protocol` bounds a request head at
`MAX_HEADER_FIELDS` header fields and `MAX_HEADER_BYTES` bytes (request line and headers),
answers one past either with `431 Request Header Fields Too Large` and an OpenAI-shaped JSON
body (`Connection: close`), half-closes its side, and reads and drops what the client still
sends (at most `DRAIN_BYTES`, for at most `DRAIN_SECONDS`) before it closes: the client gets
the answer rather than a reset. `uvicorn_config` is the one `uvicorn.Config` of
`workbench serve` and `serve_in_kernel`.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_HEADER_FIELDS = 100  # Apache's LimitRequestFields
MAX_HEADER_BYTES = 64 * 1024  # the request line and every header line
DRAIN_BYTES = 8 << 20  # after a 431, read and drop at most this much more (a body)
DRAIN_SECONDS = 5.0  # ... for at most this long, then close

_TOO_LARGE = HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE


def head_bytes(request: h11.Request) -> int:
    """The size of a parsed request head as written on the wire (request line, header lines,
    the blank line), optional whitespace left out."""
    line = len(request.method) + len(request.target) + len(b"HTTP/") + len(
        request.http_version) + 4
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers) + 2


def head_refusal(request: h11.Request) -> str | None:
    """Why a parsed request head is over the limits, or None."""
    if len(request.headers) > MAX_HEADER_FIELDS:
        return (f"The request has {len(request.headers)} header fields; the server's limit is "
                f"{MAX_HEADER_FIELDS}.")
    if head_bytes(request) > MAX_HEADER_BYTES:
        return _bytes_refusal()
    return None


def _bytes_refusal() -> str:
    return (f"The request line and headers are larger than the server's limit of "
            f"{MAX_HEADER_BYTES} bytes.")


def too_large_headers(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "RequestHeaderFieldsTooLarge", "param": None,
                      "code": int(_TOO_LARGE)}}


class LimitedConnection(h11.Connection):
    """h11's server side that also refuses a complete head over the limits (h11 itself only
    bounds an incomplete one); `refusal` says why the last refusal was a 431."""

    refusal: str | None = None

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == _TOO_LARGE:  # the head outgrew the receive buffer
                self.refusal = _bytes_refusal()
            raise
        if isinstance(event, h11.Request):
            self.refusal = head_refusal(event)
            if self.refusal is not None:
                raise h11.RemoteProtocolError(self.refusal, error_status_hint=_TOO_LARGE)
        return event


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the header limits and a graceful 431."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.conn = LimitedConnection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.drained: int | None = None  # bytes dropped since the 431; None before one
        self.drain_timer: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        if self.drained is None:
            super().data_received(data)
            return
        self.drained += len(data)
        if self.drained > DRAIN_BYTES:
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        refusal = self.conn.refusal
        if refusal is None:
            super().send_400_response(msg)
            return
        self.logger.warning("Refused a request head with 431: %s", refusal)
        body = json.dumps(too_large_headers(refusal)).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        for event in (h11.Response(status_code=int(_TOO_LARGE), headers=headers,
                                   reason=_TOO_LARGE.phrase.encode()),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        self.drain()

    def drain(self) -> None:
        """Half-closes after the answer and drops what still comes; the connection closes
        when the client closes it, past `DRAIN_BYTES` or after `DRAIN_SECONDS`."""
        self.drained = 0
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.drain_timer = self.loop.call_later(DRAIN_SECONDS, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.drain_timer is not None:
            self.drain_timer.cancel()
            self.drain_timer = None
        super().connection_lost(exc)


def uvicorn_config(app: Any, **kwargs: Any) -> uvicorn.Config:
    """uvicorn's config for `app`, HTTP/1.1 through `LimitedH11Protocol`."""
    return uvicorn.Config(app, http=LimitedH11Protocol, **kwargs)
