"""Incremental JSON scanning for streamed tool calls: one pass over a prefix of model output.

`scan_json(text, i)` returns the JSON value starting at `text[i]` in a normal form (whitespace
outside strings dropped, `", "` after commas and `": "` after colons, as `json.dumps` writes)
and where it ends, or `None` while it is still open. Every other character is copied as
written, so the normal form of a prefix is always a prefix of the normal form of the whole:
streamed argument fragments concatenate to exactly the final arguments, wherever the chunks
were cut. `scan_call_object` reads `{"name": ..., "arguments": {...}}` the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

WHITESPACE = " \t\n\r"


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


def scan_json(text: str, start: int) -> tuple[str, int | None]:
    """(normal form of the value at `text[start:]` so far, index just past it or None).

    >>> scan_json('{ "a":1 ,"b" : [1,2]} tail', 0)
    ('{"a": 1, "b": [1, 2]}', 21)
    >>> scan_json('{"a": "x', 0)
    ('{"a": "x', None)
    """
    out: list[str] = []
    depth, in_string, escape, began = 0, False, False, False
    i = skip_ws(text, start)
    while i < len(text):
        c = text[i]
        if in_string:
            out.append(c)
            if escape:
                escape = False
            elif c == "\\":
                escape = True
            elif c == '"':
                in_string = False
                if depth == 0:
                    return "".join(out), i + 1
        elif c in WHITESPACE:
            if depth == 0 and began:  # a top-level number or literal ended
                return "".join(out), i
        elif c == '"':
            in_string = began = True
            out.append(c)
        elif c in "{[":
            depth += 1
            began = True
            out.append(c)
        elif c in "}]":
            if depth == 0:  # the closer of an enclosing value: a top-level scalar ended
                return "".join(out), i
            depth -= 1
            out.append(c)
            if depth == 0:
                return "".join(out), i + 1
        elif c == ",":
            if depth == 0:
                return "".join(out), i
            out.append(", ")
        elif c == ":":
            out.append(": ")
        else:
            began = True
            out.append(c)
        i += 1
    return "".join(out), None


def normalize_json(text: str) -> str:
    """The normal form of a whole JSON text (what `scan_json` streams)."""
    return scan_json(text, 0)[0]


@dataclass
class CallScan:
    """A call object read so far: name once complete, arguments in normal form."""

    name: str | None = None
    arguments: str = ""
    arguments_done: bool = False
    end: int | None = None  # index just past the call's closing brace


class InvalidCall(ValueError):
    """The text cannot be a call object (wrong shape or bad JSON)."""


def scan_call_object(text: str, start: int, name_keys: tuple[str, ...] = ("name",),
                     argument_keys: tuple[str, ...] = ("arguments", "parameters")) -> CallScan:
    """Reads `{"name": "f", "arguments": {...}}` (keys in any order, other keys skipped) from
    `text[start:]`; stops where the text ends. Raises `InvalidCall` on a wrong shape.

    Arguments given as a JSON *string* (some models do) are decoded once complete. A call
    without arguments gets `{}` when its object closes.
    """
    scan = CallScan()
    i = skip_ws(text, start)
    if i >= len(text):
        return scan
    if text[i] != "{":
        raise InvalidCall(f"expected '{{' at {i}")
    i += 1
    while True:
        i = skip_ws(text, i)
        if i >= len(text):
            return scan
        c = text[i]
        if c == "}":
            if not scan.arguments_done:
                scan.arguments, scan.arguments_done = "{}", True
            scan.end = i + 1
            return scan
        if c == ",":
            i += 1
            continue
        if c != '"':
            raise InvalidCall(f"expected a key at {i}")
        key_text, key_end = scan_json(text, i)
        if key_end is None:
            return scan
        key = _loads(key_text)
        i = skip_ws(text, key_end)
        if i >= len(text):
            return scan
        if text[i] != ":":
            raise InvalidCall(f"expected ':' at {i}")
        i = skip_ws(text, i + 1)
        if i >= len(text):
            return scan
        value, value_end = scan_json(text, i)
        if key in name_keys:
            if value_end is None:
                return scan
            name = _loads(value)
            if not isinstance(name, str) or not name:
                raise InvalidCall("the function name is not a string")
            scan.name = name
        elif key in argument_keys:
            if value.startswith('"'):  # arguments as a JSON-encoded string
                if value_end is None:
                    return scan
                value = normalize_json(_loads(value))
            scan.arguments = value
            if value_end is None:
                return scan
            if not isinstance(_loads(value), dict):
                raise InvalidCall("the arguments are not a JSON object")
            scan.arguments_done = True
        elif value_end is None:
            return scan
        i = value_end


def _loads(text: str):
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError) as exc:
        raise InvalidCall(str(exc)) from exc
