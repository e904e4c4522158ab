"""What a tool is: its `ToolSpec` (name, description, JSON-schema parameters), the `Tool`
protocol (`spec`, `run(arguments) -> str`), `ToolError` for a refusal or failure (its message
goes back to the model), and `parse_arguments` for a call's JSON-object arguments.

Tools themselves (`calculator.py`) and tool servers (`base.py`) build on these.
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
