"""The tool server interface: what built-in tools the Responses API may run, and how.

A `ToolServer` lists its tools (`list_tools()`: name, description, JSON-schema parameters, the
shape chat templates render) and runs one by name (`call(name, arguments) -> str`). A tool's
failure is a `ToolError`; the serving layer hands its message back to the model as the tool's
output, so bad tool input never becomes a server error. `LocalToolServer` holds in-process
`Tool`s; `default_tool_server()` is what every app gets unless it is given another. What a
tool is (`ToolSpec`, `Tool`, `ToolError`, `parse_arguments`) lives in `spec.py`, below the
tools themselves, and is importable from here too.

Tools must be pure computations: none may run arbitrary code, touch files or reach the network.
"""

from __future__ import annotations

from typing import Any

from workbench.tools.calculator import Calculator
from workbench.tools.spec import Tool, ToolError, ToolSpec, parse_arguments


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
    return LocalToolServer([Calculator()])
