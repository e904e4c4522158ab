"""`TurnParser`: one generation round's text -> reasoning, content and tool calls.

It wraps the server's parsers (`--reasoning-parser`, `--tool-call-parser`). With neither in
play the text streams through as content, delta by delta; with a parser the round is parsed
when it ends (`finish`), and its pieces are sent then, so streamed and returned output come
from the same parse.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ParsedCall:
    call_id: str
    name: str
    arguments: str  # a JSON object, as text


@dataclass
class ParsedTurn:
    reasoning: str = ""
    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)


def _parser_instance(factory: Any, tokenizer: Any) -> Any:
    return factory(tokenizer)


class TurnParser:
    """Parses one round (see the module docstring); `tool_request` is the chat-shaped request
    (with the round's tools) that tool parsers read, None when tool calls are not parsed."""

    def __init__(self, tokenizer: Any, *, tool_parser: str | None, reasoning_parser: str | None,
                 tool_request: Any = None):
        self.tool_request = tool_request
        self.tools = None
        self.reasoning = None
        if tool_request is not None and tool_parser:
            from workbench.serving.tool_parsers import get_tool_parser

            self.tools = _parser_instance(get_tool_parser(tool_parser), tokenizer)
        if reasoning_parser:
            from workbench.serving.reasoning import get_reasoning_parser

            self.reasoning = _parser_instance(get_reasoning_parser(reasoning_parser), tokenizer)

    @property
    def streams_live(self) -> bool:
        return self.tools is None and self.reasoning is None

    def feed(self, delta: str) -> list[tuple[str, str]]:
        """Pieces (`"text"` or `"reasoning"`, text) to send now."""
        return [("text", delta)] if self.streams_live and delta else []

    def finish(self, text: str) -> ParsedTurn:
        turn = ParsedTurn(content=text)
        if self.reasoning is not None:
            reasoning, content = self.reasoning.extract_reasoning(text, self.tool_request)
            turn.reasoning, turn.content = reasoning or "", content or ""
        if self.tools is not None and turn.content:
            info = self.tools.extract_tool_calls(turn.content, self.tool_request)
            if info.tools_called:
                turn.content = info.content or ""
                turn.calls = [ParsedCall(call.id or f"call_{uuid.uuid4().hex}",
                                         call.function.name, call.function.arguments or "{}")
                              for call in info.tool_calls]
        return turn

    def pending_pieces(self, turn: ParsedTurn) -> list[tuple[str, str]]:
        """What `feed` held back: everything, when a parser ran."""
        if self.streams_live:
            return []
        pieces = [("reasoning", turn.reasoning)] if turn.reasoning else []
        return pieces + ([("text", turn.content)] if turn.content.strip() or not turn.calls else [])
