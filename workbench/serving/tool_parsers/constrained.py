"""Parsers for `tool_choice="required"` and named choices, whose output constrained decoding
shapes as JSON (vLLM's `get_json_schema_from_tools`), whatever the model's native format.

- required: `[{"name": "get_weather", "parameters": {...}}, ...]`, at least one call (at most
  one when `parallel_tool_calls` is false);
- named: the output is the named tool's arguments object.

Both stream with the same machinery as the native parsers (`ToolParser`).
"""

from __future__ import annotations

import json
from typing import Any

from workbench.errors import ValidationError
from workbench.serving.protocol.tools import (
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from workbench.serving.tool_parsers.abstract import Parsed, PartialCall, ToolParser
from workbench.serving.tool_parsers.json_list import read_call_list
from workbench.serving.tool_parsers.json_scan import normalize_json, scan_json, skip_ws

EMPTY_PARAMETERS = {"type": "object", "properties": {}}
# how the constrained JSON is written (llguidance's options, in the schema's `x-guidance`): as
# tool calls are in chat templates and OpenAI's answers, `{"name": "f", "parameters": {...}}`
# on one line, no whitespace anywhere else. With JSON's free whitespace a small model spends
# its tokens on newlines between the call objects and never closes the array (SmolLM2-135M:
# `[{\n "name": ...}\n\n,\n\n{...` until max_tokens); written this way it closes it.
CALL_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _function(tool: Any) -> tuple[str, dict[str, Any] | None]:
    fn = tool.function
    return fn.name, fn.parameters


def tools_json_schema(tools: list[Any], parallel_tool_calls: bool = True) -> dict[str, Any]:
    """The JSON schema of `required` output: an array of `{name, parameters}`, one per call.

    As the reference's, except that a call object takes no other keys (small models otherwise
    wander into "description" or "required" keys of their own) and the JSON is written as
    `CALL_FORMAT` says; the tools' own parameter schemas are used as given (the chat and
    Responses servings add `additionalProperties: false` where they say nothing)."""
    variants = [{"type": "object",
                 "properties": {"name": {"type": "string", "enum": [name]},
                                "parameters": _without_defs(parameters) or EMPTY_PARAMETERS},
                 "required": ["name", "parameters"], "additionalProperties": False}
                for name, parameters in map(_function, tools)]
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"anyOf": variants},  # each variant is an object
                              "x-guidance": CALL_FORMAT}
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    defs = _tool_defs(tools)
    if defs:  # `#/$defs/...` references of each tool now resolve at the root, as vLLM's
        schema["$defs"] = defs
    return schema


def _without_defs(parameters: dict[str, Any] | None) -> dict[str, Any] | None:
    if not parameters or "$defs" not in parameters:
        return parameters
    return {key: value for key, value in parameters.items() if key != "$defs"}


def _tool_defs(tools: list[Any]) -> dict[str, Any]:
    """Every tool's `$defs`, merged (vLLM's `_get_tool_schema_defs`, with its messages)."""
    merged: dict[str, Any] = {}
    for name, parameters in map(_function, tools):
        defs = (parameters or {}).get("$defs", {})
        if not isinstance(defs, dict):
            raise ValidationError(f"`$defs` in the parameters of tool '{name}' must be an "
                                  f"object, got {type(defs).__name__}.", parameter="tools")
        for def_name, def_schema in defs.items():
            if def_name in merged and merged[def_name] != def_schema:
                raise ValidationError(f"Tool definition '{def_name}' has multiple schemas, "
                                      "which is not supported.", parameter="tools")
            merged[def_name] = def_schema
    return merged


def named_tool_schema(tools: list[Any], name: str) -> dict[str, Any]:
    """The JSON schema of a named choice's output: that tool's parameters (written as
    `CALL_FORMAT` says)."""
    for tool_name, parameters in map(_function, tools):
        if tool_name == name:
            return {**(parameters or EMPTY_PARAMETERS), "x-guidance": CALL_FORMAT}
    raise KeyError(name)


class RequiredToolParser(ToolParser):
    name = "required"

    def extract_tool_calls(self, model_output: str, request: Any = None
                           ) -> ExtractedToolCallInformation:
        """As vLLM: content is always "" (the output is the calls); output that is not a
        whole call list (cut off by `max_tokens`) gives no calls, never the JSON as text."""
        info = super().extract_tool_calls(model_output, request)
        return ExtractedToolCallInformation(tools_called=info.tools_called,
                                            tool_calls=info.tool_calls, content="")

    def parse(self, text: str, request: Any, final: bool) -> Parsed:
        parsed = Parsed()
        i = skip_ws(text, 0)
        if i >= len(text):
            parsed.valid = not final
            return parsed
        if text[i] != "[":
            parsed.valid = False
            return parsed
        read_call_list(text, i + 1, parsed, argument_keys=("parameters", "arguments"))
        return parsed


class NamedToolParser(ToolParser):
    name = "named"

    def __init__(self, tokenizer: Any = None, function_name: str = ""):
        super().__init__(tokenizer)
        self.function_name = function_name

    def extract_tool_calls(self, model_output: str, request: Any = None
                           ) -> ExtractedToolCallInformation:
        """As vLLM: the output is the named call's arguments even when cut off by
        `max_tokens` (the partial JSON, as the stream sent it); content stays empty."""
        info = super().extract_tool_calls(model_output, request)
        if info.tools_called:
            return ExtractedToolCallInformation(tools_called=True, tool_calls=info.tool_calls,
                                                content="")
        parsed = self.parse(model_output, request, final=True)
        if not parsed.calls:  # nothing but whitespace (or not an object at all)
            return ExtractedToolCallInformation(tools_called=False, content="")
        call = ToolCall(function=FunctionCall(name=self.function_name,
                                              arguments=parsed.calls[0].arguments))
        return ExtractedToolCallInformation(tools_called=True, tool_calls=[call], content="")

    def parse(self, text: str, request: Any, final: bool) -> Parsed:
        if skip_ws(text, 0) >= len(text):
            return Parsed(valid=not final)
        arguments, end = scan_json(text, 0)
        if not arguments.startswith("{"):
            return Parsed(valid=False)
        call = PartialCall(self.function_name, arguments, end is not None)
        if final and end is not None:
            try:
                call.done = isinstance(json.loads(normalize_json(arguments)), dict)
            except json.JSONDecodeError:
                call.done = False
        return Parsed(calls=[call])
