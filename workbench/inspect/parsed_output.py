"""`ParsedOutput`: which generated tokens are reasoning, content or tool-call text.

Built from a chat completion body (its `logprobs.content` tokens, so request `logprobs=True`),
our engine's `RequestOutput`, or plain token strings, by running the same reasoning and tool
parsers the server runs (`workbench.serving.reasoning`, `workbench.serving.tool_parsers`)
over the concatenated tokens. It works on a body from any OpenAI-compatible server: name the
parsers that server used. Each row is one token with its character span, its logprob when
known, and its part; `reasoning`, `content` and `tool_calls` are what the parsers returned.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any

from workbench.display import html as h
from workbench.display.figure import neutral
from workbench.display.frames import frame
from workbench.serving.chat_tools import ChoiceParser
from workbench.serving.reasoning import get_reasoning_parser
from workbench.serving.tool_parsers import get_tool_parser

PART_COLORS = {"reasoning": "#e3dcf5", "content": "#ffffff", "tool_call": "#d4f0d8"}


@dataclass(frozen=True)
class TokenPart:
    """One generated token: its text, character span in the output, logprob and part."""

    position: int
    token: str
    start: int
    end: int
    part: str  # "reasoning" | "content" | "tool_call"
    logprob: float | None = None


@dataclass(frozen=True)
class ParsedOutput:
    """One choice's tokens, each marked reasoning / content / tool_call.

    >>> out = ParsedOutput.from_tokens(["<think>", "hm", "</think>", "Hi"],
    ...                                reasoning_parser="deepseek_r1")
    >>> [r.part for r in out], out.reasoning, out.content
    (['reasoning', 'reasoning', 'reasoning', 'content'], 'hm', 'Hi')
    >>> out
    ParsedOutput(4 tokens: 3 reasoning, 1 content, 0 tool_call; 0 tool calls)
    """

    rows: tuple[TokenPart, ...]
    text: str
    reasoning: str | None = None
    content: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = field(default=())
    reasoning_end: int | None = None  # character offset just past the reasoning
    tool_start: int | None = None  # character offset where tool-call text starts

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_tokens(cls, tokens: list[str], *, logprobs: list[float | None] | None = None,
                    reasoning_parser: str | None = None, tool_parser: str | None = None,
                    tools: list[dict[str, Any]] | None = None,
                    prompt_text: str | None = None,
                    chat_template_kwargs: dict[str, Any] | None = None) -> "ParsedOutput":
        """Token strings of one output; parsers by their registered names. `prompt_text`
        tells whether the prompt opened the reasoning; `tools` (chat format) give
        `qwen3_xml` its parameter types; `chat_template_kwargs` the request's (Qwen3 reads
        `enable_thinking`)."""
        text = "".join(tokens)
        reasoning = None
        if reasoning_parser:
            reasoning = get_reasoning_parser(reasoning_parser)(None, chat_template_kwargs)
            reasoning.adjust_initial_state_from_prompt(prompt_text or "")
        tool = get_tool_parser(tool_parser)() if tool_parser else None
        parser = ChoiceParser("auto" if tool else "none", tool, reasoning)
        parsed = parser.whole(text, SimpleNamespace(tools=tools or []))
        reasoning_end = parsed.reasoning_end
        if reasoning is not None and parsed.reasoning is not None and reasoning_end is None:
            reasoning_end = len(text)  # reasoning never ended
        rows, offset = [], 0
        for i, token in enumerate(tokens):
            part = "content"
            if reasoning_end is not None and offset < reasoning_end:
                part = "reasoning"
            elif parsed.tool_text_start is not None and offset >= parsed.tool_text_start:
                part = "tool_call"
            lp = logprobs[i] if logprobs is not None and i < len(logprobs) else None
            rows.append(TokenPart(i, token, offset, offset + len(token), part, lp))
            offset += len(token)
        calls = tuple({"name": c.function.name, "arguments": c.function.arguments}
                      for c in parsed.tool_calls)
        return cls(tuple(rows), text, parsed.reasoning,
                   parsed.content if parser.active else text, calls, reasoning_end,
                   parsed.tool_text_start)

    @classmethod
    def from_chat(cls, body: Any, choice: int = 0, **parsers: Any) -> "ParsedOutput":
        """A chat completion body requested with `logprobs=True` (dict, pydantic model or
        the `openai` client's object); keyword arguments as `from_tokens`."""
        data = body.model_dump() if hasattr(body, "model_dump") else dict(body)
        ch = next(c for c in data["choices"] if c["index"] == choice)
        content = (ch.get("logprobs") or {}).get("content")
        if content is None:
            raise ValueError("the choice has no logprobs: request it with logprobs=True")
        return cls.from_tokens([e["token"] for e in content],
                               logprobs=[e.get("logprob") for e in content], **parsers)

    @classmethod
    def from_request_output(cls, output: Any, tokenizer: Any, index: int = 0,
                            **parsers: Any) -> "ParsedOutput":
        """Our engine's `RequestOutput` (sample `index`); tokens decoded one by one."""
        sample = output.outputs[index]
        tokens = [tokenizer.decode([t]) for t in sample.token_ids]
        logprobs = None
        if sample.logprobs:
            logprobs = [(pos or {}).get(t).logprob if (pos or {}).get(t) is not None else None
                        for t, pos in zip(sample.token_ids, sample.logprobs)]
        return cls.from_tokens(tokens, logprobs=logprobs, **parsers)

    # -- access -----------------------------------------------------------------------------
    def __getitem__(self, position: int) -> TokenPart:
        return self.rows[position]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[TokenPart]:
        return iter(self.rows)

    @property
    def counts(self) -> dict[str, int]:
        """Tokens per part (reasoning, content, tool_call)."""
        counted = Counter(r.part for r in self.rows)
        return {part: counted.get(part, 0) for part in PART_COLORS}

    def tokens(self, part: str) -> list[str]:
        """The tokens of one part, in order."""
        return [r.token for r in self.rows if r.part == part]

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "reasoning": self.reasoning, "content": self.content,
                "tool_calls": list(self.tool_calls), "reasoning_end": self.reasoning_end,
                "tool_start": self.tool_start, "rows": [asdict(r) for r in self.rows]}

    def to_frame(self):
        return frame([asdict(r) for r in self.rows],
                     ["position", "token", "start", "end", "part", "logprob"],
                     {"logprob": "Float64"})

    def __repr__(self) -> str:
        c = self.counts
        return (f"ParsedOutput({len(self.rows)} tokens: {c['reasoning']} reasoning, "
                f"{c['content']} content, {c['tool_call']} tool_call; "
                f"{len(self.tool_calls)} tool calls)")

    def _repr_html_(self) -> str:
        """Tokens on the background of their part, whitespace as visible marks (`h.visible`);
        hover shows position, raw token, part and logprob; the parsed tool calls below."""
        spans = [f'<span title="{h.escape(f"{r.position} {r.token!r}: {r.part}, logprob ")}'
                 f'{h.escape(h.fmt(r.logprob))}" style="{h.on(PART_COLORS[r.part])};'
                 f'padding:1px 0;margin:0 1px;white-space:pre">{h.escape(h.visible(r.token))}'
                 f"</span>" for r in self.rows]
        legend = h.swatches(PART_COLORS.items(), "parts:")
        calls = h.table(["tool", "arguments"], [(c["name"], c["arguments"])
                                                for c in self.tool_calls]) if self.tool_calls else ""
        div_id = h.content_id("wb-parsed", self.to_dict())
        return h.themed(f'<div id="{div_id}" style="font-family:monospace;line-height:1.9">'
                        f'{h.caption(h.escape(repr(self)))}{legend}'
                        f'{"".join(spans)}{calls}</div>')

    def plot(self, ax: Any = None) -> Any:
        """Each token's logprob (0 where unknown) as a bar in its part's colour (matplotlib);
        returns the axes."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib
        from matplotlib.patches import Patch

        if ax is None:
            _, ax = plt.subplots(figsize=(1 + 0.15 * max(len(self.rows), 20), 3))
        ax.bar([r.position for r in self.rows], [r.logprob or 0.0 for r in self.rows],
               color=[PART_COLORS[r.part] for r in self.rows], edgecolor="#444444",
               linewidth=0.5)
        ax.legend(handles=[Patch(facecolor=c, edgecolor="#444444", label=p)
                           for p, c in PART_COLORS.items()], fontsize=8)
        ax.set_xlabel("generated position")
        ax.set_ylabel("logprob")
        ax.set_title(repr(self), fontsize=9)
        return neutral(ax)
