"""Tool calls written as a JSON list of call objects after a marker.

`read_call_list(text, i, parsed)` reads `{"name": ..., "arguments": {...}}, ...]` from just
after the `[` (Mistral's pre-v11 format and the `required` tool choice use it too).
`JsonListToolParser` is the whole format "content, marker, `[calls]`", with these parsers:

- `granite`: `<|tool_call|>[...]` (Granite 3.0) or `<tool_call>[...]` (3.1);
- `jamba`: `<tool_calls>[...]</tool_calls>`;
- `phi4_mini_json`: `functools[...]`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from workbench.serving.tool_parsers.abstract import Parsed, PartialCall, ToolParser, hold_back
from workbench.serving.tool_parsers.json_scan import InvalidCall, scan_call_object, skip_ws


def read_call_list(text: str, i: int, parsed: Parsed,
                   argument_keys: tuple[str, ...] = ("arguments", "parameters")) -> int | None:
    """Appends the calls of a JSON list whose `[` ends at `i`; returns the index past the
    closing `]`, None while the list is open. Marks `parsed` invalid on a wrong shape."""
    while True:
        try:
            scan = scan_call_object(text, i, argument_keys=argument_keys)
        except InvalidCall:
            parsed.valid = False
            return None
        if scan.end is None:
            if scan.name is not None or scan.arguments:
                parsed.calls.append(PartialCall(scan.name, scan.arguments, False))
            return None
        if scan.name is None:
            parsed.valid = False
            return None
        parsed.calls.append(PartialCall(scan.name, scan.arguments, True))
        i = skip_ws(text, scan.end)
        if i >= len(text):
            return None
        if text[i] == "]":
            return i + 1
        if text[i] != ",":
            parsed.valid = False
            return None
        i += 1


class JsonListToolParser(ToolParser):
    """Content, then one of `markers`, then a JSON list of calls."""

    markers: ClassVar[tuple[str, ...]] = ()

    def _marker(self, text: str) -> tuple[int, str] | None:
        found = [(text.find(m), m) for m in self.markers if m in text]
        return min(found) if found else None

    def parse(self, text: str, request: Any, final: bool) -> Parsed:
        found = self._marker(text)
        if found is None:
            if final:
                return Parsed(content=text)
            for marker in self.markers:
                text = hold_back(text, marker)
            return Parsed(content=text)
        position, marker = found
        parsed = Parsed(content=text[:position])
        i = skip_ws(text, position + len(marker))
        if i >= len(text):
            return parsed
        if text[i] != "[":
            parsed.valid = False
            return parsed
        read_call_list(text, i + 1, parsed)
        return parsed


class GraniteToolParser(JsonListToolParser):
    name = "granite"
    special_markers = True
    markers = ("<|tool_call|>", "<tool_call>")


class JambaToolParser(JsonListToolParser):
    name = "jamba"
    special_markers = True
    markers = ("<tool_calls>",)


class Phi4MiniJsonToolParser(JsonListToolParser):
    name = "phi4_mini_json"
    markers = ("functools",)
