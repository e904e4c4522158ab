"""`ToolSet`: the tools of one Responses request, and which one a `tool_choice` names.

Function tools (`{"type": "function", "name", "parameters", "strict"}`, flat as the Responses
API has them) become chat-format tools for the template and the parsers; a tool whose `type` is
one of the tool server's names (`{"type": "calculator"}`) enables that built-in tool. Unknown
types, nameless functions and duplicate names are 400s naming `tools`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.errors import ValidationError
from workbench.tools.base import ToolServer, ToolSpec


@dataclass
class ToolSet:
    """The tools of one request: the client's function tools and the enabled built-ins."""

    functions: list[dict[str, Any]] = field(default_factory=list)  # chat-format tools
    builtins: list[ToolSpec] = field(default_factory=list)
    loose: set[str] = field(default_factory=set)  # function tools declared `strict: false`

    @classmethod
    def build(cls, tools: list[dict[str, Any]], server: ToolServer) -> "ToolSet":
        toolset, names = cls(), set()
        available = {spec.name: spec for spec in server.list_tools()}
        for tool in tools:
            kind = tool.get("type")
            if kind == "function":
                if not tool.get("name"):
                    raise ValidationError("A function tool needs a `name`.", parameter="tools")
                name = tool["name"]
                if tool.get("strict") is False:
                    toolset.loose.add(name)
                toolset.functions.append({"type": "function", "function": {
                    key: tool[key] for key in ("name", "description", "parameters")
                    if tool.get(key) is not None}})
            elif kind in available:
                name = kind
                toolset.builtins.append(available[kind])
            else:
                offered = ", ".join(["function", *available]) or "function"
                raise ValidationError(f"Tool type '{kind}' is not available on this server "
                                      f"(tool types: {offered}).", parameter="tools", value=kind)
            if name in names:
                raise ValidationError(f"Tool '{name}' is declared twice.", parameter="tools")
            names.add(name)
        return toolset

    def __bool__(self) -> bool:
        return bool(self.functions or self.builtins)

    def template_tools(self) -> list[dict[str, Any]] | None:
        tools = [*self.functions, *(spec.as_function() for spec in self.builtins)]
        return tools or None

    def is_builtin(self, name: str) -> bool:
        return any(spec.name == name for spec in self.builtins)


def forced_name(choice: dict[str, Any]) -> str | None:
    """The tool a dict `tool_choice` names: `{"type": "function", "name": N}`, or a built-in
    tool by its type (`{"type": "calculator"}`)."""
    return choice.get("name") if choice.get("type") == "function" else choice.get("type")
