"""`pythonic` (also `llama4_pythonic`): a Python list of calls, `[f(a=1, b="x"), g()]`.

The output is tool calls when it starts with `[` (leading whitespace aside); keyword arguments
only, each value a Python literal (strings, numbers, True/False/None, lists, dicts, tuples),
read with `ast.literal_eval` and never executed. Arguments are the JSON of the keyword dict,
streamed one whole argument at a time (a value is known once a `,` or `)` follows it).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from workbench.serving.tool_parsers.abstract import Parsed, PartialCall, ToolParser
from workbench.serving.tool_parsers.json_scan import skip_ws

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


class _Invalid(ValueError):
    pass


def scan_python_value(text: str, i: int) -> int | None:
    """Index of the `,` or `)` that ends the literal starting at `text[i]`; None while open."""
    depth, quote, escape = 0, None, False
    while i < len(text):
        c = text[i]
        if quote is not None:
            if escape:
                escape = False
            elif c == "\\":
                escape = True
            elif text.startswith(quote, i):
                i += len(quote) - 1
                quote = None
        elif c in "'\"":
            quote = text[i:i + 3] if text[i:i + 3] in ("'''", '"""') else c
            i += len(quote) - 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                return i if c == ")" else _raise(f"unexpected {c!r}")
            depth -= 1
        elif c == "," and depth == 0:
            return i
        i += 1
    return None


def _raise(message: str):
    raise _Invalid(message)


def _json_value(literal: str) -> str:
    try:
        value = ast.literal_eval(literal.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise _Invalid(str(exc)) from exc
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as exc:  # sets, complex numbers, bytes
        raise _Invalid(str(exc)) from exc


class PythonicToolParser(ToolParser):
    name = "pythonic"

    def parse(self, text: str, request: Any, final: bool) -> Parsed:
        i = skip_ws(text, 0)
        if i == len(text):
            return Parsed(content=text if final else "")
        if text[i] != "[":
            return Parsed(content=text)
        parsed = Parsed()
        try:
            end = self._calls(text, i + 1, parsed)
        except _Invalid:
            parsed.valid = False
            return parsed
        if final and (end is None or skip_ws(text, end) != len(text) or not parsed.calls):
            parsed.valid = False
        return parsed

    def _calls(self, text: str, i: int, parsed: Parsed) -> int | None:
        """Reads calls up to the closing `]`; returns the index past it (None while open)."""
        while True:
            i = skip_ws(text, i)
            if i >= len(text):
                return None
            if text[i] == "]":
                return i + 1
            if text[i] == "," and parsed.calls:
                i += 1
                continue
            match = _IDENT.match(text, i)
            if match is None:
                raise _Invalid(f"expected a function name at {i}")
            j = skip_ws(text, match.end())
            if j >= len(text):
                return None  # the name may go on
            if text[j] != "(":
                raise _Invalid(f"expected '(' at {j}")
            call = PartialCall(name=match.group(), arguments="{")
            parsed.calls.append(call)
            end = self._arguments(text, j + 1, call)
            if end is None:
                return None
            i = end

    def _arguments(self, text: str, i: int, call: PartialCall) -> int | None:
        """Keyword arguments up to `)`, each appended to `call.arguments` once complete."""
        count = 0
        while True:
            i = skip_ws(text, i)
            if i >= len(text):
                return None
            if text[i] == ")":
                call.arguments += "}"
                call.done = True
                return i + 1
            if text[i] == "," and count:
                i += 1
                continue
            match = _IDENT.match(text, i)
            if match is None or "." in match.group():
                raise _Invalid(f"expected a keyword argument at {i}")
            j = skip_ws(text, match.end())
            if j >= len(text):
                return None
            if text[j] != "=":
                raise _Invalid("only keyword arguments are supported")
            end = scan_python_value(text, j + 1)
            if end is None:
                return None
            separator = ", " if count else ""
            call.arguments += f"{separator}{json.dumps(match.group())}: {_json_value(text[j + 1:end])}"
            count += 1
            i = end
