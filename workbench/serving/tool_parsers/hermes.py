"""`hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, repeatable.

Hermes 2/3 and the Qwen2.5 / QwQ / Qwen3 JSON format (also registered as `qwen3_json`), and
the format of this project's SmolLM2 tools template. Text before the first `<tool_call>` is
content; text between and after calls is dropped; a missing closing tag is tolerated.
"""

from __future__ import annotations

from typing import Any

from workbench.serving.tool_parsers.abstract import Parsed, PartialCall, ToolParser, hold_back
from workbench.serving.tool_parsers.json_scan import InvalidCall, scan_call_object


class HermesToolParser(ToolParser):
    name = "hermes"
    special_markers = True  # special tokens in Hermes / Qwen tokenizers
    start, end = "<tool_call>", "</tool_call>"

    def parse(self, text: str, request: Any, final: bool) -> Parsed:
        first = text.find(self.start)
        if first < 0:
            return Parsed(content=text if final else hold_back(text, self.start))
        parsed = Parsed(content=text[:first])
        position = first
        while position >= 0:
            try:
                scan = scan_call_object(text, position + len(self.start))
            except InvalidCall:
                parsed.valid = False
                return parsed
            parsed.calls.append(PartialCall(scan.name, scan.arguments, scan.end is not None))
            if scan.end is None:
                break
            position = text.find(self.start, scan.end)
        return parsed
