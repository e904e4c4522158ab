"""`TurnParser`: one generation round's text, as it streams -> reasoning, content, tool calls.

It chains the server's parsers in their streaming form: the reasoning parser
(`--reasoning-parser`) splits reasoning from content, the tool parser (`--tool-call-parser`,
when the request has tools and `tool_choice` is not "none") finds calls in the content. Each
`feed(delta)` returns the pieces to send now: `("reasoning", text)`, `("text", text)` or
`("call", DeltaToolCall)` (id and name first, then argument fragments); `finish()` releases
what the parsers held back. Streamed and returned output are built from the same pieces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.serving.reasoning import get_reasoning_parser

Piece = tuple[str, Any]


@dataclass
class ParsedCall:
    call_id: str
    name: str
    arguments: str = ""  # a JSON object, as text (the concatenated fragments)


@dataclass
class ParsedTurn:
    reasoning: str = ""
    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)

    def add(self, pieces: list[Piece]) -> None:
        for kind, value in pieces:
            if kind == "reasoning":
                self.reasoning += value
            elif kind == "text":
                self.content += value
            elif value.index == len(self.calls):
                self.calls.append(ParsedCall(value.id, value.function.name,
                                             value.function.arguments or ""))
            else:
                self.calls[value.index].arguments += value.function.arguments or ""


class TurnParser:
    """Parses one round (see the module docstring); `tool_request` is the chat-shaped request
    (with the round's tools) that tool parsers read, None when tool calls are not parsed;
    `tool_parser` is a fresh parser instance (the server's, or a constrained-choice one)."""

    def __init__(self, tokenizer: Any, *, tool_parser: Any = None, reasoning_parser: str | None,
                 tool_request: Any = None, prompt_text: str | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None):
        self.tool_request = tool_request
        self.tools = tool_parser if tool_request is not None else None  # a parser instance
        self.reasoning = None
        if reasoning_parser:
            self.reasoning = get_reasoning_parser(reasoning_parser)(tokenizer,
                                                                     chat_template_kwargs)
            if prompt_text is not None:
                self.reasoning.adjust_initial_state_from_prompt(prompt_text)
        self.text = ""  # the round's raw text so far
        self.content = ""  # its content (after reasoning) so far, as the tool parser saw it
        self.turn = ParsedTurn()

    def feed(self, delta: str) -> list[Piece]:
        """The pieces to send after `delta` arrived."""
        if not delta:
            return []
        previous, self.text = self.text, self.text + delta
        if self.reasoning is None:
            return self._record(self._content(delta, final=False))
        message = self.reasoning.extract_reasoning_streaming(previous, self.text, delta)
        return self._record(self._split(message, final=False))

    def finish(self) -> list[Piece]:
        """What the parsers held back until the end of the round."""
        if self.reasoning is None:
            return self._record(self._content("", final=True))
        message = self.reasoning.finish_streaming(self.text)
        return self._record(self._split(message, final=True))

    def _record(self, pieces: list[Piece]) -> list[Piece]:
        self.turn.add(pieces)
        return pieces

    def _split(self, message: Any, final: bool) -> list[Piece]:
        pieces: list[Piece] = []
        if message is not None and message.reasoning:
            pieces.append(("reasoning", message.reasoning))
        content = message.content if message is not None and message.content else ""
        return pieces + self._content(content, final)

    def _content(self, delta: str, final: bool) -> list[Piece]:
        """Content through the tool parser (when there is one)."""
        previous, self.content = self.content, self.content + delta
        if self.tools is None:
            return [("text", delta)] if delta else []
        message = (self.tools.extract_tool_calls_streaming(previous, self.content, delta,
                                                            request=self.tool_request)
                   if delta else None)
        pieces = self._message_pieces(message)
        if final:
            pieces += self._message_pieces(self.tools.finish_streaming(self.content,
                                                                       self.tool_request))
        return pieces

    @staticmethod
    def _message_pieces(message: Any) -> list[Piece]:
        if message is None:
            return []
        pieces: list[Piece] = [("text", message.content)] if message.content else []
        return pieces + [("call", call) for call in message.tool_calls or []]
