"""The request-head limits of `LimitedH11Protocol`, on h11 alone (no server; the live 431s are
in `tests/reliability/test_hostile.py`)."""

from __future__ import annotations

import h11
import pytest

from workbench.http.protocol import (
    MAX_HEADER_BYTES,
    MAX_HEADER_FIELDS,
    LimitedConnection,
    head_bytes,
    too_large_headers,
)


def _head(lines: list[bytes]) -> bytes:
    return b"GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\n" + b"".join(
        line + b"\r\n" for line in lines) + b"\r\n"


def test_head_bytes_is_the_size_on_the_wire():
    wire = _head([b"X-Long: " + b"b" * 100, b"Accept: */*"])
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(wire)
    assert head_bytes(conn.next_event()) == len(wire)


@pytest.mark.parametrize("lines, why", [
    ([b"X-Big-%d: %s" % (i, b"a" * 1000) for i in range(70)], f"limit of {MAX_HEADER_BYTES} bytes"),
    ([b"X-%d: 1" % i for i in range(MAX_HEADER_FIELDS)], f"limit is {MAX_HEADER_FIELDS}"),
])
def test_a_complete_head_over_a_limit_is_refused_with_431(lines, why):
    conn = LimitedConnection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
    conn.receive_data(_head(lines))  # the whole head in one read: h11 alone would take it
    with pytest.raises(h11.RemoteProtocolError) as refused:
        conn.next_event()
    assert refused.value.error_status_hint == 431
    assert conn.refusal is not None and why in conn.refusal


def test_an_incomplete_head_past_the_buffer_is_refused_with_431():
    conn = LimitedConnection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
    conn.receive_data(_head([b"X-Big: " + b"a" * MAX_HEADER_BYTES])[:-4])  # no blank line yet
    with pytest.raises(h11.RemoteProtocolError):
        conn.next_event()
    assert conn.refusal is not None and f"{MAX_HEADER_BYTES} bytes" in conn.refusal


def test_a_head_within_the_limits_is_a_request_and_other_errors_are_not_431s():
    conn = LimitedConnection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
    conn.receive_data(_head([b"X-%d: 1" % i for i in range(MAX_HEADER_FIELDS - 1)]))
    assert isinstance(conn.next_event(), h11.Request) and conn.refusal is None
    bad = LimitedConnection(h11.SERVER)
    bad.receive_data(b"NOT HTTP\r\n\r\n")
    with pytest.raises(h11.RemoteProtocolError):
        bad.next_event()
    assert bad.refusal is None  # uvicorn's plain 400


def test_the_431_body_is_the_openai_error_shape():
    assert too_large_headers("why") == {"error": {
        "message": "why", "type": "RequestHeaderFieldsTooLarge", "param": None, "code": 431}}
