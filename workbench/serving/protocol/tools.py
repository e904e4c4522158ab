"""Tool-call models shared by chat completions, the Responses API and the tool parsers.

`ToolCall` is one call in a finished message (`arguments` is a JSON string, as OpenAI's);
`DeltaToolCall` is a piece of one in a stream: the first piece of call `index` carries `id`,
`type` and `function.name` (arguments ""), the later ones only argument fragments, whose
concatenation is exactly the finished call's `arguments`.
"""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import Field

from workbench.serving.protocol.common import OpenAIBaseModel


def tool_call_id() -> str:
    """A fresh id in the reference's form, `chatcmpl-tool-<hex>`."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(OpenAIBaseModel):
    id: str = Field(default_factory=tool_call_id)
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(OpenAIBaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(OpenAIBaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class ExtractedToolCallInformation(OpenAIBaseModel):
    """What a tool parser found in a whole output: the calls and the remaining content."""

    tools_called: bool
    tool_calls: list[ToolCall] = Field(default_factory=list)
    content: str | None = None
