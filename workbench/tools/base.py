"""The tool server interface: what built-in tools the Responses API may run, and how.

A `ToolServer` lists its tools (`list_tools()`: name, description, JSON-schema parameters, the
shape chat templates render) and runs one by name (`call(name, arguments) -> str`). A tool's
failure is a `ToolError`; the serving layer hands its message back to the model as the tool's
output, so bad tool input never becomes a server error. `LocalToolServer` holds in-process
`Tool`s; `default_tool_server()` is what every app gets unless it is given another.

Tools must be pure computations: none may run arbitrary code, touch files or reach the network.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol


class ToolError(Exception):
    """A tool refused its input or failed; the message goes back to the model."""


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about a tool (rendered into the chat template as a function)."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)

    def as_function(self) -> dict[str, Any]:
        """The chat-completions tool shape templates expect."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


class Tool(Protocol):
    spec: ToolSpec

    def run(self, arguments: dict[str, Any]) -> str: ...


class ToolServer:
    """Base of every tool server: `list_tools` and `call`; `has_tool` comes for free."""

    def list_tools(self) -> list[ToolSpec]:
        raise NotImplementedError

    def call(self, name: str, arguments: str | dict[str, Any]) -> str:
        raise NotImplementedError

    def has_tool(self, name: str) -> bool:
        return any(spec.name == name for spec in self.list_tools())

    def spec(self, name: str) -> ToolSpec | None:
        return next((s for s in self.list_tools() if s.name == name), None)


def parse_arguments(arguments: str | dict[str, Any]) -> dict[str, Any]:
    """A tool call's arguments (a JSON object, as a string or already parsed) -> a dict."""
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ToolError(f"arguments are not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise ToolError("arguments must be a JSON object")
    return parsed


class LocalToolServer(ToolServer):
    """Tools that run in this process, by name.

    >>> from workbench.tools.calculator import Calculator
    >>> LocalToolServer([Calculator()]).call("calculator", '{"expression": "6 * 7"}')
    '42'
    """

    def __init__(self, tools: list[Tool] | None = None):
        self._tools: dict[str, Tool] = {}
        for tool in tools or []:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        self._tools[tool.spec.name] = tool

    def list_tools(self) -> list[ToolSpec]:
        return [tool.spec for tool in self._tools.values()]

    def call(self, name: str, arguments: str | dict[str, Any]) -> str:
        tool = self._tools.get(name)
        if tool is None:
            raise ToolError(f"unknown tool {name!r}; available: {', '.join(self._tools) or 'none'}")
        return tool.run(parse_arguments(arguments))


def default_tool_server() -> LocalToolServer:
    """The built-in tools every server offers: the arithmetic `calculator`."""
    from workbench.tools.calculator import Calculator

    return LocalToolServer([Calculator()])
