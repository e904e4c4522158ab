"""The built-in tool loop of one response (the reference's `_generate_with_builtin_tools`).

    render the conversation -> generate (sub-request `<id>_<round>`) -> parse the round
    -> the model called built-in tools only? run them, append the calls and their outputs,
       render the next turn and go on; otherwise (text, or a client function call) stop.

Each round is one engine request with its own id; rounds after the first run at the
reference's priority `priority - 1` (under `EngineConfig(scheduling_policy="priority")` lower
values run first, so a loop already holding context finishes before new requests). Bounds: the
context (a next turn that would not fit ends the response `incomplete`, reason
`context_length`), `max_output_tokens` per round, as vLLM 0.32 (reason `max_output_tokens`) and
`max_tool_calls` (default `DEFAULT_MAX_TOOL_CALLS`; reason `max_tool_calls`). A tool's failure
is its output (`Error: ...`), handed back to the model; it never fails the request.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import ValidationError
from workbench.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from workbench.serving.chat_template import effective_kwargs
from workbench.serving.errors import GenerationError
from workbench.serving.logprobs import chat_logprobs
from workbench.serving.prompts import EnginePrompt
from workbench.serving.protocol.chat import ChatCompletionRequest, ChatMessageParam
from workbench.serving.protocol.responses import ResponsesRequest, ResponseStatus
from workbench.serving.reasoning import get_reasoning_parser
from workbench.serving.responses import checks
from workbench.serving.responses import items as it
from workbench.serving.responses.events import OutputBuilder
from workbench.serving.responses.parsing import TurnParser
from workbench.serving.responses.toolset import ToolSet, forced_name
from workbench.serving.sampling import NEUTRAL_DEFAULTS
from workbench.serving.tool_parsers import get_tool_parser
from workbench.serving.tool_parsers.constrained import (
    NamedToolParser,
    RequiredToolParser,
    named_tool_schema,
    tools_json_schema,
)

DEFAULT_MAX_TOOL_CALLS = 8


@dataclass
class ToolCallRecord:
    """One call the model made in a round; `output` is None for a client function tool."""

    call_id: str
    name: str
    arguments: str
    builtin: bool
    output: str | None = None
    error: bool = False


@dataclass
class ToolRound:
    """One generation round of a response: its engine request and the calls it made."""

    index: int
    request_id: str
    priority: int
    prompt_tokens: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    reasoning_tokens: int = 0
    finish_reason: str | None = None
    calls: list[ToolCallRecord] = field(default_factory=list)
    tool_output_tokens: int = 0

    @property
    def output_tokens(self) -> int:
        return len(self.token_ids)


def sampling_params(request: ResponsesRequest, max_tokens: int,
                    defaults: dict[str, Any]) -> SamplingParams:
    """Request > the model's generation config > neutral, as the chat endpoint."""
    values = {name: getattr(request, name) if getattr(request, name) is not None
              else defaults.get(name, neutral) for name, neutral in NEUTRAL_DEFAULTS.items()}
    stop_ids = list(request.stop_token_ids or [])
    stop_ids += [t for t in defaults.get("stop_token_ids") or [] if t not in stop_ids]
    logit_bias: Any = request.logit_bias  # str keys: SamplingParams parses them to token ids
    return SamplingParams(**values, seed=request.seed, stop=request.stop, stop_token_ids=stop_ids,
                          ignore_eos=request.ignore_eos, max_tokens=max_tokens,
                          include_stop_str_in_output=request.include_stop_str_in_output,
                          skip_special_tokens=request.skip_special_tokens,
                          logit_bias=logit_bias, output_kind=RequestOutputKind.DELTA)


class ToolLoop:
    """Runs one response's rounds (see the module docstring); `run()` yields stream events."""

    def __init__(self, serving: Any, request: ResponsesRequest, response_id: str,
                 messages: list[dict[str, Any]], tools: ToolSet, priority: int):
        self.serving = serving
        self.request = request
        self.response_id = response_id
        self.input_messages = messages  # the conversation before this response (no instructions)
        self.tools = tools
        self.priority = priority
        self.lora_request = serving.lora_request_for(request)  # a served adapter's name
        # what the reasoning parser reads (`enable_thinking`): server defaults, then the request's
        self.template_kwargs = effective_kwargs(serving.config.default_chat_template_kwargs,
                                                request.chat_template_kwargs)
        self.builder = OutputBuilder()
        self.rounds: list[ToolRound] = []
        self.status: ResponseStatus = "in_progress"
        self.incomplete_reason: str | None = None
        self._space = ""  # whitespace-only text not sent yet
        self.max_tool_calls = (DEFAULT_MAX_TOOL_CALLS if request.max_tool_calls is None
                               else request.max_tool_calls)
        self.constraint = checks.structured_outputs(request)  # text.format, every round
        parse_tools = bool(tools) and request.tool_choice != "none"
        self.tool_request = self._tool_request() if parse_tools else None
        self.logprobs = checks.wants_logprobs(request, parsed=parse_tools or bool(
            serving.reasoning_parser_name))

    def _tool_request(self) -> ChatCompletionRequest:
        """The chat-shaped request tool parsers read (its tools and tool choice)."""
        return ChatCompletionRequest.model_validate({  # the tools as dicts, validated
            "messages": [ChatMessageParam(role="user", content="")],
            "tools": self.tools.template_tools(), "tool_choice": "auto"})

    # -- prompts ------------------------------------------------------------------------------
    @property
    def conversation(self) -> list[dict[str, Any]]:
        """The input conversation and this response's output so far, as chat messages."""
        return self.input_messages + it.output_messages(self.builder.items)

    def render(self) -> EnginePrompt:
        """The conversation so far through the chat template. In the first round, an input
        ending with an unfinished assistant item (status `in_progress` / `incomplete`) is
        continued, not answered (the reference's prefill: `continue_final_message`)."""
        messages = it.with_instructions(self.conversation, self.request.instructions)
        effort = (self.request.reasoning or {}).get("effort")
        prefill = not self.rounds and it.ends_unfinished(self.request.input)
        rendered = self.serving.renderer.render(
            [ChatMessageParam(**m) for m in messages], tools=self.tools.template_tools(),
            chat_template_kwargs=self.request.chat_template_kwargs, reasoning_effort=effort,
            add_generation_prompt=not prefill, continue_final_message=prefill)
        ids = self.serving.tokenizer(rendered.prompt, add_special_tokens=False).input_ids
        return EnginePrompt(token_ids=list(ids), text=rendered.prompt)

    def first_prompt(self) -> EnginePrompt:
        """The first round's prompt; too long for the context -> the reference's 400."""
        prompt = self.render()
        max_len = self.serving.max_model_len
        if len(prompt.token_ids) >= max_len:
            raise ValidationError(f"The engine prompt length {len(prompt.token_ids)} exceeds the "
                                  f"max_model_len {max_len}. Please reduce prompt.",
                                  parameter="input", value=len(prompt.token_ids))
        return prompt

    # -- the loop -----------------------------------------------------------------------------
    def _budget(self) -> int | None:
        """The bound of each round: vLLM 0.32 gives every round `max_output_tokens` (its
        `get_max_tokens` per turn), not a total over the rounds."""
        return self.request.max_output_tokens

    def _stop(self, status: ResponseStatus, reason: str | None = None) -> None:
        self.status, self.incomplete_reason = status, reason

    async def run(self, prompt: EnginePrompt) -> AsyncIterator[list[dict[str, Any]]]:
        calls_made = 0
        while True:
            room, budget = self.serving.max_model_len - len(prompt.token_ids), self._budget()
            if room < 1:
                self._stop("incomplete", "context_length")
                break
            if budget is not None and budget < 1:
                self._stop("incomplete", "max_output_tokens")
                break
            limit = self.serving.defaults.get("max_tokens")
            max_tokens = min(v for v in (room, budget, limit) if v is not None)
            async for events in self._round(prompt, max_tokens):
                yield events
            last = self.rounds[-1]
            if last.finish_reason == "length":
                bound = "context_length" if max_tokens == room and max_tokens != budget else \
                    "max_output_tokens"
                self._stop("incomplete", bound)
                break
            if last.finish_reason == "abort":
                self._stop("cancelled")
                break
            builtin = [c for c in last.calls if c.builtin]
            if not builtin or len(builtin) < len(last.calls):
                self._stop("completed")  # text, or a function call for the client to run
                break
            if calls_made + len(builtin) > self.max_tool_calls:
                self._stop("incomplete", "max_tool_calls")
                break
            calls_made += len(builtin)
            for call in builtin:
                await self._run_tool(call, last)
            yield self.builder.drain()
            prompt = await self.serving.cpu.run(self.render)  # off the event loop
        if not self.builder.items:
            self.builder.empty_message()  # the model said nothing: one empty message
        self.builder.close()
        yield self.builder.drain()

    async def _round(self, prompt: EnginePrompt, max_tokens: int
                     ) -> AsyncIterator[list[dict[str, Any]]]:
        index = len(self.rounds)
        record = ToolRound(index=index, request_id=f"{self.response_id}_{index}",
                           priority=self.priority if index == 0 else self.priority - 1,
                           prompt_tokens=len(prompt.token_ids))
        self.rounds.append(record)
        params = sampling_params(self.request, max_tokens, self.serving.defaults)
        if self.logprobs:
            params.logprobs = self.request.top_logprobs or 0
        after = self._after_reasoning(prompt.text)
        if self.constraint is not None:
            params.structured_outputs = dataclasses.replace(self.constraint, after_token_ids=after)
        tool_parser = None
        if self.tool_request is not None:
            tool_parser = self._forced_parser(params, after) if index == 0 else None
            tool_parser = tool_parser or self._auto_parser()
        if getattr(tool_parser, "special_markers", False):  # as the parser's adjust_request
            params.skip_special_tokens = False
        parser = TurnParser(self.serving.tokenizer, tool_parser=tool_parser,
                            reasoning_parser=self.serving.reasoning_parser_name,
                            tool_request=self.tool_request, prompt_text=prompt.text,
                            chat_template_kwargs=self.template_kwargs)
        async for output in self.serving.engine_stream(prompt, params, record.request_id,
                                                       record.priority, self.lora_request):
            for out in output.outputs:
                if out.finish_reason == "error":
                    raise GenerationError()
                record.text += out.text or ""
                record.token_ids += list(out.token_ids or [])
                record.finish_reason = out.finish_reason or record.finish_reason
                if self.logprobs:  # plain text: each delta is exactly its tokens' text
                    self.builder.text(out.text or "", self._logprobs(out))
                    continue
                self._send(parser.feed(out.text or ""))
            yield self.builder.drain()
        self._send(parser.finish(), final=True)
        self.builder.close()
        if parser.reasoning is not None:  # counted as the chat endpoint counts them
            record.reasoning_tokens = parser.reasoning.count_reasoning_tokens(record.token_ids,
                                                                             record.text)
        calls = parser.turn.calls[:1 if self.request.parallel_tool_calls is False else None]
        record.calls = [ToolCallRecord(c.call_id, c.name, c.arguments,
                                       builtin=self.tools.is_builtin(c.name)) for c in calls]
        yield self.builder.drain()

    def _auto_parser(self) -> Any:
        return get_tool_parser(self.serving.tool_parser_name)(self.serving.tokenizer)

    def _after_reasoning(self, prompt_text: str | None) -> list[int] | None:
        """Where a constraint starts: after the reasoning's end tag when this output will
        reason (the prompt opened it, or the parser reasons from the first token), as chat."""
        name = self.serving.reasoning_parser_name
        if not name:
            return None
        reasoning = get_reasoning_parser(name)(self.serving.tokenizer, self.template_kwargs)
        reasoning.adjust_initial_state_from_prompt(prompt_text or "")
        return (reasoning.end_token_ids or None) if reasoning.reasons_from_start else None

    def _forced_parser(self, params: SamplingParams, after: list[int] | None) -> Any:
        """`required` or a named tool in the first round: constrained decoding writes the
        calls as JSON (the reference's schemas), parsed by the matching constrained parser.
        Later rounds are "auto", so the loop can end."""
        assert self.tool_request is not None and self.tool_request.tools is not None, \
            "called only when the loop parses tools"
        choice, tools = self.request.tool_choice, self.tool_request.tools
        parser: RequiredToolParser | NamedToolParser
        if choice == "required":
            schema = tools_json_schema(tools, self.request.parallel_tool_calls is not False)
            parser = RequiredToolParser(self.serving.tokenizer)
            strict = not self.tools.loose
        elif isinstance(choice, dict):
            name = forced_name(choice)
            assert name is not None, "checks.check_tool_choice refuses an unknown tool"
            schema = named_tool_schema(tools, name)
            parser = NamedToolParser(self.serving.tokenizer, function_name=name)
            strict = name not in self.tools.loose
        else:
            return None
        # `strict` (the Responses API's default for function tools): no properties beyond
        # the schema's, as OpenAI's strict mode
        params.structured_outputs = StructuredOutputsParams(
            json=schema, after_token_ids=after, disable_additional_properties=strict,
            parameter="tool_choice")
        return parser

    def _logprobs(self, out: Any) -> list[dict[str, Any]]:
        content = chat_logprobs(list(out.token_ids or []),
                                out.logprobs or [None] * len(out.token_ids or []),
                                self.request.top_logprobs or 0, self.serving.tokenizer,
                                as_token_ids=self.serving.config.return_tokens_as_token_ids)
        return [entry.model_dump() for entry in content.content or []]

    def _send(self, pieces: list[tuple[str, Any]], final: bool = False) -> None:
        """Pieces into the builder. Whitespace-only text waits: before a tool call it is
        dropped (a template's newline, not a message), as the reference does."""
        for kind, value in pieces:
            if kind == "reasoning":
                if self.request.include_reasoning:
                    self.builder.reasoning(value)
            elif kind == "text":
                self._space += value
                if self._space.strip():
                    self.builder.text(self._space)
                    self._space = ""
            else:
                self._space = ""
                if value.index == 0 or self.request.parallel_tool_calls is not False:
                    self.builder.call(value)
        if final and self._space:
            self.builder.text(self._space)
            self._space = ""

    async def _run_tool(self, call: ToolCallRecord, record: ToolRound) -> None:
        """Runs a built-in tool off the event loop; any failure is the model's to read."""
        try:
            output = await asyncio.to_thread(self.serving.tool_server.call, call.name,
                                             call.arguments)
        except Exception as exc:  # noqa: BLE001 - a tool error is an answer for the model
            output, call.error = f"Error: {exc}", True
        call.output = output
        record.tool_output_tokens += len(self.serving.tokenizer(
            output, add_special_tokens=False).input_ids)
        self.builder.function_call_output(call.call_id, output)


__all__ = ["DEFAULT_MAX_TOOL_CALLS", "forced_name", "ToolCallRecord", "ToolLoop", "ToolRound",
           "ToolSet", "sampling_params"]
