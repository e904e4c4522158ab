"""`qwen3_xml` (also `qwen3_coder`): Qwen3-Coder's XML-like tool calls.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Values are text; each is converted to JSON by the type its tool's schema gives the parameter
(string, integer, number, boolean, object / array; untyped: JSON if it parses, else a
string), as the reference does. Arguments stream one whole parameter at a time. Text before
the first `<tool_call>` (or a bare `<function=`) is content.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from workbench.serving.tool_parsers.abstract import Parsed, PartialCall, ToolParser, hold_back

_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")


def parameter_types(request: Any, function: str) -> dict[str, Any]:
    """`{parameter: JSON-schema type}` of `function` among the request's tools."""
    for tool in getattr(request, "tools", None) or []:
        fn = tool.function if hasattr(tool, "function") else tool.get("function", {})
        name = fn.name if hasattr(fn, "name") else fn.get("name")
        if name == function:
            params = (fn.parameters if hasattr(fn, "parameters") else fn.get("parameters")) or {}
            return {k: (v or {}).get("type") for k, v in (params.get("properties") or {}).items()}
    return {}


def convert_value(value: str, kind: Any) -> Any:
    """A parameter's text as the JSON value its schema type asks for."""
    if value.lower() == "null" and kind not in _STRING_TYPES:
        return None
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind in _STRING_TYPES:
        return value
    try:
        if kind in ("integer", "int"):
            return int(value)
        if kind in ("number", "float"):
            number = float(value)
            return int(number) if number.is_integer() and "." not in value else number
        if kind in ("boolean", "bool"):
            return value.strip().lower() == "true"
    except ValueError:
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        pass
    if kind in ("object", "array", "dict", "list"):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            pass
    return value


class Qwen3XMLToolParser(ToolParser):
    name = "qwen3_xml"
    special_markers = True
    start, function = "<tool_call>", "<function="
    param, param_end, function_end = "<parameter=", "</parameter>", "</function>"

    def _first(self, text: str) -> int:
        found = [p for p in (text.find(self.start), text.find(self.function)) if p >= 0]
        return min(found) if found else -1

    def parse(self, text: str, request: Any, final: bool) -> Parsed:
        first = self._first(text)
        if first < 0:
            if final:
                return Parsed(content=text)
            return Parsed(content=hold_back(hold_back(text, self.start), self.function))
        parsed = Parsed(content=text[:first])
        position = text.find(self.function, first)
        while position >= 0:
            name_end = text.find(">", position)
            if name_end < 0:
                return parsed
            name = text[position + len(self.function):name_end].strip()
            if not name or "<" in name:
                parsed.valid = False
                return parsed
            call = PartialCall(name=name, arguments="{")
            parsed.calls.append(call)
            end = self._parameters(text, name_end + 1, call, parameter_types(request, name))
            if end is None:
                return parsed
            position = text.find(self.function, end)
        return parsed

    def _parameters(self, text: str, i: int, call: PartialCall, types: dict[str, Any]
                    ) -> int | None:
        """Parameters up to `</function>`; returns the index past it (None while open)."""
        count = 0
        while True:
            next_param = text.find(self.param, i)
            close = text.find(self.function_end, i)
            if close >= 0 and (next_param < 0 or close < next_param):
                call.arguments += "}"
                call.done = True
                return close + len(self.function_end)
            if next_param < 0:
                return None
            key_end = text.find(">", next_param)
            if key_end < 0:
                return None
            key = text[next_param + len(self.param):key_end].strip()
            value_end = self._value_end(text, key_end + 1)
            if value_end is None:
                return None
            value = text[key_end + 1:value_end]
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            encoded = json.dumps(convert_value(value, types.get(key)), ensure_ascii=False)
            call.arguments += f"{', ' if count else ''}{json.dumps(key)}: {encoded}"
            count += 1
            i = value_end
            if text.startswith(self.param_end, i):
                i += len(self.param_end)

    def _value_end(self, text: str, i: int) -> int | None:
        """Where a value ends: `</parameter>`, or (tag forgotten) the next `<parameter=` or
        `</function>`."""
        ends = [p for p in (text.find(self.param_end, i), text.find(self.param, i),
                            text.find(self.function_end, i)) if p >= 0]
        return min(ends) if ends else None
