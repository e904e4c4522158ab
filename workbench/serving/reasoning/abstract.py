"""`ReasoningParser`: splits model output into reasoning and content, whole or streamed.

The `<think>...</think>` family: `split(text, final)` says where reasoning starts and ends in
an output so far; as with the tool parsers, what it returns for a prefix is a prefix of what
it returns for the whole, so `extract_reasoning` (whole) and `extract_reasoning_streaming`
(deltas, then `finish_streaming`) agree however the stream was chunked. A partial `</think>`
at the end of a stream is held back until the next text decides it.

A prompt can open the reasoning itself (DeepSeek-R1's template ends with `<think>\\n`):
`adjust_initial_state_from_prompt` notices, and the output is reasoning until `</think>`.
A parser with `thinking_switch` (Qwen3) reads the request's `chat_template_kwargs`:
`enable_thinking: false` makes the whole output content; `implicit_end` (Qwen3's `<tool_call>`)
also ends the reasoning, the tag staying in the content for the tool parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from workbench.serving.protocol.chat import DeltaMessage
from workbench.serving.tool_parsers.abstract import hold_back


@dataclass(frozen=True)
class Split:
    """Reasoning and content of an output so far; `end` is the character offset just past
    the reasoning (its end tag included), None while reasoning goes on or when there is none."""

    reasoning: str | None
    content: str
    end: int | None = None

    @property
    def ended(self) -> bool:
        return self.end is not None


class ReasoningParser:
    """Base of the start/end-tag reasoning parsers: `cls(tokenizer)`, one per output stream.

    >>> ReasoningParser().extract_reasoning("<think>2+2=4</think>The answer is 4.")
    ('2+2=4', 'The answer is 4.')
    """

    name: ClassVar[str] = ""
    start_token: ClassVar[str] = "<think>"
    end_token: ClassVar[str] = "</think>"
    # True: output is reasoning from its first character even without a start tag (R1)
    reasoning_without_start: ClassVar[bool] = True
    # a tag that ends the reasoning as well as `end_token` (and stays in the content)
    implicit_end: ClassVar[str | None] = None
    # True: `chat_template_kwargs={"enable_thinking": False}` turns reasoning off (Qwen3)
    thinking_switch: ClassVar[bool] = False

    def __init__(self, tokenizer: Any = None, chat_template_kwargs: dict[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.thinking = not (self.thinking_switch and
                             (chat_template_kwargs or {}).get("enable_thinking", True) is False)
        self.opened_by_prompt = False
        self.closed_by_prompt = False
        self._sent_reasoning = 0
        self._sent_content = 0

    @property
    def start_token_ids(self) -> list[int]:
        return self._ids(self.start_token)

    @property
    def end_token_ids(self) -> list[int]:
        """The token ids of the end tag (a special token in reasoning models; several tokens
        in others, e.g. SmolLM2's `</`, `think`, `>`)."""
        return self._ids(self.end_token)

    def _ids(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @property
    def reasons_from_start(self) -> bool:
        """Whether the output is reasoning from its first token: the prompt opened it, or the
        parser needs no start tag (and thinking is on)."""
        return self.thinking and not self.closed_by_prompt and (
            self.opened_by_prompt or self.reasoning_without_start)

    def adjust_initial_state_from_prompt(self, prompt_text: str) -> None:
        """A prompt whose last start tag is not closed has opened the reasoning; one that ends
        with the end tag (Qwen3's template without thinking) has closed it."""
        start = prompt_text.rfind(self.start_token)
        self.opened_by_prompt = start >= 0 and prompt_text.find(self.end_token, start) < 0
        self.closed_by_prompt = prompt_text.rstrip().endswith(self.end_token)

    def split(self, text: str, final: bool) -> Split:
        if not self.thinking:
            return Split(None, text)
        stripped = text.lstrip()
        offset = len(text) - len(stripped)
        if stripped.startswith(self.start_token):
            begin = offset + len(self.start_token)
        elif not final and self.start_token.startswith(stripped):
            return Split(None, "")  # may be the start tag: wait
        elif self.reasons_from_start:
            begin = 0
        else:
            return Split(None, text)  # no reasoning in this output
        close = text.find(self.end_token, begin)
        implicit = text.find(self.implicit_end, begin) if self.implicit_end else -1
        if implicit >= 0 and (close < 0 or implicit < close):  # a tool call ends it
            return Split(text[begin:implicit], text[implicit:], implicit)
        if close < 0:
            reasoning = text[begin:]
            if not final:
                reasoning = hold_back(reasoning, self.end_token)
                if self.implicit_end:
                    reasoning = hold_back(reasoning, self.implicit_end)
            return Split(reasoning, "")
        end = close + len(self.end_token)
        return Split(text[begin:close], text[end:], end)

    def extract_reasoning(self, model_output: str, request: Any = None
                          ) -> tuple[str | None, str | None]:
        """(reasoning or None, content or None) of a whole output."""
        split = self.split(model_output, final=True)
        return split.reasoning, split.content or None

    def extract_reasoning_streaming(self, previous_text: str, current_text: str,
                                    delta_text: str, previous_token_ids: Any = None,
                                    current_token_ids: Any = None, delta_token_ids: Any = None
                                    ) -> DeltaMessage | None:
        """What is new since the last call: reasoning and / or content; None when nothing."""
        return self._delta(self.split(current_text, final=False))

    def finish_streaming(self, current_text: str) -> DeltaMessage | None:
        return self._delta(self.split(current_text, final=True))

    def _delta(self, split: Split) -> DeltaMessage | None:
        reasoning = (split.reasoning or "")[self._sent_reasoning:]
        content = split.content[self._sent_content:]
        self._sent_reasoning += len(reasoning)
        self._sent_content += len(content)
        if not reasoning and not content:
            return None
        message = DeltaMessage()
        if reasoning:
            message.reasoning = reasoning
        if content:
            message.content = content
        return message

    def is_reasoning_end(self, token_ids: list[int]) -> bool:
        """Whether the end tag's token ids occur in `token_ids` (the output so far)."""
        end = self.end_token_ids
        return bool(end) and any(list(token_ids[i:i + len(end)]) == end
                                 for i in range(len(token_ids) - len(end) + 1))

    def count_reasoning_tokens(self, token_ids: list[int], text: str) -> int:
        """How many of an output's tokens are reasoning (its end tag included): the shortest
        prefix of `token_ids` whose decoded text reaches where the reasoning ends."""
        split = self.split(text, final=True)
        if split.reasoning is None:
            return 0
        if split.end is None or self.tokenizer is None:
            return len(token_ids) if split.end is None else 0
        lo, hi = 1, len(token_ids)
        while lo < hi:  # decoded length grows with the prefix
            mid = (lo + hi) // 2
            if len(self.tokenizer.decode(token_ids[:mid])) >= split.end:
                hi = mid
            else:
                lo = mid + 1
        return lo
