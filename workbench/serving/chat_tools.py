"""Tool calls and reasoning in chat completions: which parsers a request gets, and what they
make of each choice's text, whole or streamed.

`ChatTools` is built once per server from `ServerConfig` (`--enable-auto-tool-choice`,
`--tool-call-parser`, `--reasoning-parser`). Per request it checks `tool_choice` against
the server (the reference's messages), lets the tool parser adjust the request, and gives the
JSON schema that constrained decoding enforces for `required` / named choices. Per choice it
makes a `ChoiceParser`: reasoning first (`reasoning` field, `include_reasoning`), then tool
calls in the remaining content: the configured parser for `auto`, the JSON-array parser for
`required`, the arguments parser for a named tool. `parallel_tool_calls: false` keeps the
first call only (as the reference, a filter; `required` also gets `maxItems: 1`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

from workbench.errors import ValidationError
from workbench.sampling_params import StructuredOutputsParams
from workbench.serving.chat_template import effective_kwargs
from workbench.serving.protocol.chat import ChatMessage, DeltaMessage
from workbench.serving.protocol.tools import ToolCall
from workbench.serving.reasoning import ReasoningParser, get_reasoning_parser
from workbench.serving.tool_parsers import ToolParser, get_tool_parser
from workbench.serving.tool_parsers.constrained import (
    NamedToolParser,
    RequiredToolParser,
    named_tool_schema,
    tools_json_schema,
)

# SmolLM2's template with tools (Hermes-style), package data: `chat_template=` its `.read_text()`
# (or `--chat-template` its path), with `--tool-call-parser hermes`
TOOLS_TEMPLATE = files("workbench.serving") / "chat_templates" / "smollm2_tools.jinja"

AUTO_NEEDS_PARSER = ('"auto" tool choice requires --enable-auto-tool-choice and '
                     "--tool-call-parser to be set")
REQUIRED_NEEDS_PARSER = 'tool_choice="required" requires --tool-call-parser to be set'
TOOLS_AND_CONSTRAINTS = ("You can only either use constraints for structured outputs or tools, "
                         "not both.")


def tool_mode(request: Any) -> str:
    """'none', 'auto', 'required' or 'named' (tools are ignored without a choice to use them)."""
    choice = request.tool_choice
    if not request.tools or choice in (None, "none"):
        return "none"
    if isinstance(choice, dict):
        return "named"
    return choice


def named_function(request: Any) -> str:
    """The function of a named `tool_choice` (validation checked it names one of the tools)."""
    choice = request.tool_choice
    name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    assert name is not None, "a named tool_choice names one of the tools"
    return name


def _has_constraint(request: Any) -> bool:
    response_format = getattr(request, "response_format", None) or {}
    return bool(getattr(request, "structured_outputs", None)) or \
        response_format.get("type", "text") not in ("text", None)


@dataclass
class ParsedChoice:
    """A whole choice's text, parsed: reasoning, content, tool calls."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning_end: int | None = None  # character offset just past `</think>`
    tool_text_start: int | None = None  # character offset where tool-call text begins


class ChoiceParser:
    """Reasoning, then tool calls, over one choice's text; one instance per choice."""

    def __init__(self, mode: str, tools: ToolParser | None, reasoning: ReasoningParser | None,
                 *, include_reasoning: bool = True, first_call_only: bool = False):
        self.mode, self.tools, self.reasoning = mode, tools, reasoning
        self.include_reasoning = include_reasoning
        self.first_call_only = first_call_only
        self._reasoning_sent = 0
        self._content_sent = 0

    @property
    def active(self) -> bool:
        return self.tools is not None or self.reasoning is not None

    def _split(self, text: str, final: bool) -> tuple[str | None, str, int | None]:
        if self.reasoning is None:
            return None, text, None
        split = self.reasoning.split(text, final)
        return split.reasoning, split.content, split.end

    def whole(self, text: str, request: Any) -> ParsedChoice:
        content: str | None
        reasoning, content, end = self._split(text, final=True)
        offset = end or 0
        calls: list[ToolCall] = []
        tool_start = None
        if self.tools is not None:
            info = self.tools.extract_tool_calls(content, request)
            if info.tools_called:
                calls = info.tool_calls[:1] if self.first_call_only else info.tool_calls
                tool_start = offset + len(info.content or "")
            content = info.content
        elif self.reasoning is not None:
            content = content or None
        return ParsedChoice(reasoning if self.include_reasoning else None, content, calls,
                            end, tool_start)

    def delta(self, text: str, request: Any, final: bool = False) -> DeltaMessage | None:
        """What the text so far adds to the stream (`final`: the end of the stream)."""
        reasoning, content, _ = self._split(text, final)
        message = DeltaMessage()
        new_reasoning = (reasoning or "")[self._reasoning_sent:]
        self._reasoning_sent += len(new_reasoning)
        if new_reasoning and self.include_reasoning:
            message.reasoning = new_reasoning
        if self.tools is not None:
            tool_message = (self.tools.finish_streaming(content, request) if final else
                            self.tools.extract_tool_calls_streaming("", content, "",
                                                                    request=request))
            if tool_message is not None and tool_message.content:
                message.content = tool_message.content
            calls = tool_message.tool_calls if tool_message is not None else []
            if self.first_call_only:
                calls = [c for c in calls if c.index == 0]
            if calls:
                message.tool_calls = calls
        else:
            new_content = content[self._content_sent:]
            self._content_sent += len(new_content)
            if new_content:
                message.content = new_content
        return message if message.model_fields_set else None

    def called_tools(self, parsed: ParsedChoice | None = None) -> bool:
        if parsed is not None:
            return bool(parsed.tool_calls)
        return self.tools is not None and self.tools.calls_sent > 0

    def finish_reason(self, engine_reason: str | None, called: bool) -> str | None:
        """`tool_calls` when auto / required produced calls and the engine stopped; named
        choices keep `stop`, as the reference."""
        if called and engine_reason == "stop" and self.mode in ("auto", "required"):
            return "tool_calls"
        return engine_reason


class ChatTools:
    """The server's tool and reasoning parser settings, applied to chat requests."""

    def __init__(self, config: Any, tokenizer: Any):
        self.tokenizer = tokenizer
        self.auto = bool(config.enable_auto_tool_choice and config.tool_call_parser)
        self.tool_parser = get_tool_parser(config.tool_call_parser) \
            if config.tool_call_parser else None
        self.reasoning_parser = get_reasoning_parser(config.reasoning_parser) \
            if config.reasoning_parser else None
        self.default_template_kwargs = dict(config.default_chat_template_kwargs)

    def check(self, request: Any) -> None:
        """Validate stage: `tool_choice` against the server's parsers (the reference's
        messages), and tools with output constraints."""
        mode = tool_mode(request)
        if mode == "auto" and not self.auto:
            raise ValidationError(AUTO_NEEDS_PARSER, parameter="tool_choice")
        if mode in ("required", "named") and self.tool_parser is None:
            raise ValidationError(REQUIRED_NEEDS_PARSER, parameter="tool_choice")
        if mode in ("required", "named") and _has_constraint(request):
            raise ValidationError(TOOLS_AND_CONSTRAINTS, parameter="tool_choice")
        if mode in ("required", "named") and getattr(request, "use_beam_search", False):
            raise ValidationError(f"tool_choice={request.tool_choice!r} is enforced with "
                                  "structured outputs, which beam search does not support.",
                                  parameter="tool_choice")

    def adjust_request(self, request: Any) -> None:
        """Preprocess stage: the parser's own request changes (special tokens kept) whenever
        a parser is set and tools may be called (`auto`, `required`, named), as vLLM."""
        if tool_mode(request) != "none" and self.tool_parser is not None:
            self.tool_parser(self.tokenizer).adjust_request(request)

    def json_schema(self, request: Any) -> dict[str, Any] | None:
        """The schema constrained decoding enforces for `required` / named choices."""
        mode = tool_mode(request)
        if mode == "required":
            return tools_json_schema(request.tools, request.parallel_tool_calls is not False)
        if mode == "named":
            return named_tool_schema(request.tools, named_function(request))
        return None

    def constrain(self, request: Any, params: Any, prompt_text: str | None) -> None:
        """`required` / named: the tools' JSON schema as the sampling constraint. With a
        reasoning parser it starts once `</think>` is generated, if the output is expected to
        reason (R1, or a prompt that opened `<think>`); otherwise from the first token."""
        schema = self.json_schema(request)
        if schema is None and params.structured_outputs is None:
            return

        after = None
        if self.reasoning_parser is not None:
            reasoning = self.new_reasoning(request, prompt_text)
            if reasoning.reasons_from_start:
                after = reasoning.end_token_ids or None
        if schema is None:  # response_format / structured_outputs: also after the reasoning
            if after and params.structured_outputs.after_token_ids is None:
                params.structured_outputs = dataclasses.replace(params.structured_outputs,
                                                                after_token_ids=after)
            return
        # a call's arguments are the parameters the tool declares (unless its schema allows
        # more, `additionalProperties`), as OpenAI's strict mode and the Responses API's
        # default: a small model otherwise invents keys ("time" for get_time(city))
        params.structured_outputs = StructuredOutputsParams(
            json=schema, after_token_ids=after, disable_additional_properties=True,
            parameter="tool_choice")

    def budget_thinking(self, request: Any, params: Any, prompt_text: str | None) -> Any:
        """`params` with the request's `thinking_token_budget`: the engine ends the reasoning
        after that many tokens by forcing the reasoning parser's end tag (`engine/requests/thinking.py`).
        The reasoning opens at the first output token when the prompt opened it or the parser
        needs no start tag (R1), else once the model writes the start tag."""
        budget = request.thinking_token_budget
        if budget is None or budget == -1:
            return params
        if self.reasoning_parser is None:
            raise ValidationError("`thinking_token_budget` needs a reasoning parser: start the "
                                  "server with --reasoning-parser.",
                                  parameter="thinking_token_budget", value=budget)
        reasoning = self.new_reasoning(request, prompt_text)
        opened = reasoning.reasons_from_start
        return dataclasses.replace(  # SamplingParams checks the budget again on the copy
            params, thinking_token_budget=budget,
            reasoning_end_token_ids=reasoning.end_token_ids,
            reasoning_start_token_ids=None if opened else reasoning.start_token_ids)

    def choice_parser(self, request: Any, prompt_text: str | None) -> ChoiceParser:
        mode = tool_mode(request)
        tools: ToolParser | None = None
        if mode == "auto":
            assert self.tool_parser is not None, "check() refuses `auto` without a tool parser"
            tools = self.tool_parser(self.tokenizer)
        elif mode == "required":
            tools = RequiredToolParser(self.tokenizer)
        elif mode == "named":
            tools = NamedToolParser(self.tokenizer, named_function(request))
        reasoning = None
        if self.reasoning_parser is not None:
            reasoning = self.new_reasoning(request, prompt_text)
        return ChoiceParser(mode, tools, reasoning,
                            include_reasoning=request.include_reasoning,
                            first_call_only=request.parallel_tool_calls is False)

    def new_reasoning(self, request: Any, prompt_text: str | None) -> ReasoningParser:
        """The server's reasoning parser for one output of `request`: it reads the template
        kwargs in effect (`--default-chat-template-kwargs`, then the request's), as vLLM."""
        kwargs = effective_kwargs(self.default_template_kwargs,
                                  getattr(request, "chat_template_kwargs", None))
        assert self.reasoning_parser is not None, "callers check for a reasoning parser"
        reasoning = self.reasoning_parser(self.tokenizer, kwargs)
        reasoning.adjust_initial_state_from_prompt(prompt_text or "")
        return reasoning

    def reasoning_tokens(self, parser: ChoiceParser, token_ids: list[int], text: str) -> int:
        if parser.reasoning is None:
            return 0
        return parser.reasoning.count_reasoning_tokens(token_ids, text)

    @property
    def counts_reasoning(self) -> bool:
        """The reference reports `completion_tokens_details.reasoning_tokens` only with a
        reasoning parser."""
        return self.reasoning_parser is not None


def chat_message(parser: ChoiceParser, role: str, echo: str, text: str, request: Any
                 ) -> tuple[Any, bool, ParsedChoice | None]:
    """The non-streaming message of one choice: (ChatMessage, tools called, parse or None)."""
    if not parser.active:
        return ChatMessage(role=role, content=echo + text), False, None
    parsed = parser.whole(text, request)
    content = parsed.content
    if echo:
        content = echo + (content or "")
    message = ChatMessage(role=role, content=content, reasoning=parsed.reasoning,
                          tool_calls=parsed.tool_calls)
    return message, parser.called_tools(parsed), parsed


def stream_parts(parser: ChoiceParser, so_far: Any, request: Any, logprobs: Any,
                 token_ids: Any) -> tuple[DeltaMessage | None, Any, Any, str | None]:
    """One streamed step of a choice whose text is parsed: (delta message or None, logprobs,
    token ids, finish reason). `so_far` is the choice's merged `ChoiceDelta`. Without
    `include_reasoning`, logprobs and token ids are withheld, as the reference, so they
    cannot leak the reasoning."""
    finished = so_far.finish_reason is not None
    message = parser.delta(so_far.text, request, final=finished)
    if parser.reasoning is not None and not parser.include_reasoning:
        logprobs = token_ids = None
    finish_reason = None
    if finished:
        finish_reason = parser.finish_reason(so_far.finish_reason, parser.called_tools())
    return message, logprobs, token_ids, finish_reason
