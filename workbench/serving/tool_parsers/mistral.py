"""`mistral`: Mistral's `[TOOL_CALLS]` formats.

- tokenizer v11+: `[TOOL_CALLS]name[ARGS]{...}` (or `[TOOL_CALLS]name{...}`), the marker
  repeated for each parallel call;
- earlier: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.

Text before the first `[TOOL_CALLS]` is content.
"""

from __future__ import annotations

import re
from typing import Any

from workbench.serving.tool_parsers.abstract import Parsed, PartialCall, ToolParser, hold_back
from workbench.serving.tool_parsers.json_list import read_call_list
from workbench.serving.tool_parsers.json_scan import scan_json, skip_ws

_NAME = re.compile(r"[A-Za-z0-9_\-.]+")


class MistralToolParser(ToolParser):
    name = "mistral"
    special_markers = True
    marker, args_marker = "[TOOL_CALLS]", "[ARGS]"

    def parse(self, text: str, request: Any, final: bool) -> Parsed:
        first = text.find(self.marker)
        if first < 0:
            return Parsed(content=text if final else hold_back(text, self.marker))
        parsed = Parsed(content=text[:first])
        i = skip_ws(text, first + len(self.marker))
        if text.startswith("[", i) and not text.startswith(self.args_marker, i):
            read_call_list(text, i + 1, parsed)
        else:
            self._parse_named(text, first, parsed, final)
        return parsed

    def _parse_named(self, text: str, position: int, parsed: Parsed, final: bool) -> None:
        """`[TOOL_CALLS]name[ARGS]{...}` repeated."""
        while position >= 0:
            start = position + len(self.marker)
            brace = text.find("{", start)
            tag = text.find(self.args_marker, start)
            if tag >= 0 and (brace < 0 or tag < brace):
                name_end, args_start = tag, tag + len(self.args_marker)
            elif brace >= 0:
                name_end, args_start = brace, brace
            else:  # the name is still being written
                if final or not _NAME.fullmatch(hold_back(text[start:], self.args_marker).strip()
                                                or "x"):
                    parsed.valid = False
                return
            name = text[start:name_end].strip()
            if not _NAME.fullmatch(name):
                parsed.valid = False
                return
            arguments, end = scan_json(text, args_start)
            if arguments and not arguments.startswith("{"):
                parsed.valid = False
                return
            parsed.calls.append(PartialCall(name, arguments, end is not None))
            if end is None:
                return
            position = text.find(self.marker, end)
