"""`ToolParser`: finds tool calls in model output, whole or streamed, under one contract.

Each parser writes one method, `parse(text, request, final)`: the content and the calls found
in `text` so far. The content and every call's arguments it returns for a prefix of an output
must be prefixes of what it returns for the whole output (`json_scan` gives this for JSON
arguments; the other formats add whole arguments one at a time). On that contract the base
class builds both APIs the reference has:

- `extract_tool_calls(output, request)`: `parse(..., final=True)`; an output that is not a
  well-formed call becomes plain content, as in the reference.
- `extract_tool_calls_streaming(previous_text, current_text, delta_text, ...)`: parses the
  text so far and sends what is new: content, then per call a first delta with index, id, type
  and name (arguments ""), then argument fragments. `finish_streaming` sends what only the end
  of the output decides (held-back text that was not a tool-call tag after all).

So the chunking cannot change the result: the property tests cut real outputs at every
position and reassemble the same calls and content.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from workbench.serving.protocol.chat import DeltaMessage
from workbench.serving.protocol.tools import (
    DeltaFunctionCall,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
    tool_call_id,
)


@dataclass
class PartialCall:
    """One call as far as the text goes: the name once complete, arguments so far."""

    name: str | None = None
    arguments: str = ""
    done: bool = False  # the arguments are complete


@dataclass
class Parsed:
    """What `parse` found: content so far, the calls, and whether the text is well-formed
    (`valid=False`: not a call after all; at the end, the whole output is content)."""

    content: str = ""
    calls: list[PartialCall] = field(default_factory=list)
    valid: bool = True


def hold_back(text: str, marker: str) -> str:
    """`text` without a trailing proper prefix of `marker` (it may be the marker's start).

    >>> hold_back("Sure <tool_", "<tool_call>")
    'Sure '
    """
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return text[:-k]
    return text


def _complete(parsed: Parsed) -> bool:
    """Well-formed, with at least one call, every call named and closed."""
    return parsed.valid and bool(parsed.calls) and all(
        c.name is not None and c.done for c in parsed.calls)


@dataclass
class _Sent:
    id: str
    arguments: int = 0  # characters of arguments sent


class ToolParser:
    """Base of the tool parsers: `cls(tokenizer)`, one instance per output stream."""

    name: ClassVar[str] = ""
    special_markers: ClassVar[bool] = False  # markers are special tokens: keep them in text

    def __init__(self, tokenizer: Any = None):
        self.tokenizer = tokenizer
        self._content_sent = 0
        self._calls_sent: list[_Sent] = []

    def adjust_request(self, request: Any) -> Any:
        """As the reference: parsers whose markers are special tokens keep them in the text."""
        if self.special_markers and getattr(request, "tools", None) and \
                getattr(request, "tool_choice", "none") != "none":
            request.skip_special_tokens = False
        return request

    def parse(self, text: str, request: Any, final: bool) -> Parsed:
        """Content and calls found in `text` (an output so far, or the whole one if `final`)."""
        raise NotImplementedError

    # whole outputs ----------------------------------------------------------------------------

    def extract_tool_calls(self, model_output: str, request: Any = None
                           ) -> ExtractedToolCallInformation:
        parsed = self.parse(model_output, request, final=True)
        if not _complete(parsed):
            return ExtractedToolCallInformation(tools_called=False, content=model_output)
        calls = [ToolCall(function=FunctionCall(name=c.name, arguments=c.arguments))
                 for c in parsed.calls if c.name is not None]  # all are, as _complete checked
        return ExtractedToolCallInformation(tools_called=True, tool_calls=calls,
                                            content=parsed.content or None)

    # streams ----------------------------------------------------------------------------------

    def extract_tool_calls_streaming(self, previous_text: str, current_text: str,
                                     delta_text: str, previous_token_ids: Any = None,
                                     current_token_ids: Any = None, delta_token_ids: Any = None,
                                     request: Any = None) -> DeltaMessage | None:
        """What is new in `current_text` since the last call; None when nothing is."""
        return self._delta(self.parse(current_text, request, final=False), final=False)

    def finish_streaming(self, current_text: str, request: Any = None) -> DeltaMessage | None:
        """The end of the stream: releases held-back text and unsent argument text."""
        parsed = self.parse(current_text, request, final=True)
        if not self._calls_sent and not _complete(parsed):
            parsed = Parsed(content=current_text)  # not a call after all: all of it is content
        return self._delta(parsed, final=True)

    @property
    def calls_sent(self) -> int:
        return len(self._calls_sent)

    def _delta(self, parsed: Parsed, final: bool) -> DeltaMessage | None:
        content = parsed.content[self._content_sent:]
        self._content_sent = max(self._content_sent, len(parsed.content))
        tool_deltas: list[DeltaToolCall] = []
        for index, call in enumerate(parsed.calls):
            if call.name is None:
                break  # calls go out in order
            if index == len(self._calls_sent):
                self._calls_sent.append(_Sent(id=tool_call_id()))
                tool_deltas.append(DeltaToolCall(
                    index=index, id=self._calls_sent[index].id, type="function",
                    function=DeltaFunctionCall(name=call.name, arguments="")))
                if not final:
                    continue  # the arguments follow in a later delta
            sent = self._calls_sent[index]
            fragment = call.arguments[sent.arguments:]
            if fragment:
                sent.arguments = len(call.arguments)
                tool_deltas.append(DeltaToolCall(
                    index=index, function=DeltaFunctionCall(arguments=fragment)))
        if not content and not tool_deltas:
            return None
        message = DeltaMessage(content=content) if content else DeltaMessage()
        if tool_deltas:
            message.tool_calls = tool_deltas
        return message
