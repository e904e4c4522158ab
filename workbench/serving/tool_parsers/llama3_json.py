"""`llama3_json` (also `llama4_json`): Llama 3.x JSON tool calls.

The output is tool calls when it starts with `<|python_tag|>` or `{`: one or more objects
`{"name": ..., "parameters": {...}}` ("arguments" also accepted) separated by `;`. Anything
else is content.
"""

from __future__ import annotations

from typing import Any

from workbench.serving.tool_parsers.abstract import Parsed, PartialCall, ToolParser
from workbench.serving.tool_parsers.json_scan import InvalidCall, scan_call_object, skip_ws


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    special_markers = True
    bot = "<|python_tag|>"

    def parse(self, text: str, request: Any, final: bool) -> Parsed:
        i = skip_ws(text, 0)
        rest = text[i:]
        if rest.startswith(self.bot):
            i += len(self.bot)
        elif not rest.startswith("{"):
            if not final and (self.bot.startswith(rest)):
                return Parsed()  # maybe the start of the tag: wait
            return Parsed(content=text)
        parsed = Parsed()
        while True:
            try:
                scan = scan_call_object(text, i)
            except InvalidCall:
                parsed.valid = False
                return parsed
            if scan.end is None:
                if scan.name is not None or scan.arguments:
                    parsed.calls.append(PartialCall(scan.name, scan.arguments, False))
                elif final:
                    parsed.valid = parsed.valid and skip_ws(text, i) == len(text) and bool(parsed.calls)
                return parsed
            if scan.name is None:
                parsed.valid = False
                return parsed
            parsed.calls.append(PartialCall(scan.name, scan.arguments, True))
            i = skip_ws(text, scan.end)
            if i < len(text) and text[i] == ";":
                i += 1
            elif i < len(text):
                parsed.valid = False  # trailing text that is not another call
                return parsed
