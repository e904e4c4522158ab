"""`/v1/chat/completions`: messages -> the chat template -> one generated assistant message.

The pipeline comes from `OpenAIServing` and `GenerationServing`; this module supplies the
request's hooks and stage 6. One
function, `choice_parts`, turns a `ChoiceDelta` into content, logprobs and token ids for both
the non-streaming message and each streamed delta. Streams follow the reference: a role chunk
per choice first, then one chunk per engine step, the finish reason on the last one, an
optional usage chunk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from workbench.sampling_params import SamplingParams
from workbench.serving import unsupported
from workbench.serving.base import RequestMeta
from workbench.serving.chat_template import ChatRenderer, content_text
from workbench.serving.chat_tools import ChatTools, chat_message, stream_parts
from workbench.serving.context import ServeContext
from workbench.serving.errors import error_response
from workbench.serving.generation import GenerationServing
from workbench.serving.logprobs import (
    chat_logprobs,
    positions_or_blank,
    prompt_logprobs_json,
    token_stats_json,
)
from workbench.serving.lora import message_content_types
from workbench.serving.prompts import EnginePrompt
from workbench.serving.protocol.chat import (
    ChatCompletionLogProbs,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    DeltaMessage,
)
from workbench.serving.sampling import build_sampling_params, resolve_max_tokens
from workbench.serving.streaming import (
    ChoiceDelta,
    chunk_json,
    error_json,
    inside_fields,
    usage_chunk_json,
    usage_info,
    usage_options,
)


class ChatServing(GenerationServing):
    id_prefix = "chatcmpl"
    supports_lora = True

    def content_types(self, request: ChatCompletionRequest) -> set[str]:
        """Its content parts' types: a default adapter named like exactly one applies."""
        return message_content_types(request.messages)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.renderer = ChatRenderer.for_server(self.tokenizer, self.config)
        self.tools = ChatTools(self.config, self.tokenizer)  # tool and reasoning parsers

    def engine_request_id(self, ctx: ServeContext, index: int) -> str:
        return ctx.request_id

    def validate(self, ctx: ServeContext[ChatCompletionRequest]) -> None:
        self.tools.check(ctx.request)
        unsupported.check_chat(ctx.request)

    def preprocess(self, ctx: ServeContext[ChatCompletionRequest]) -> None:
        ctx.engine_prompts = [self.render(ctx.request)]

    def render(self, request: ChatCompletionRequest) -> EnginePrompt:
        """The conversation through the chat template, tokenized and length-checked."""
        self.tools.adjust_request(request)
        tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None
        rendered = self.renderer.render(
            request.messages, add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            chat_template=request.chat_template, chat_template_kwargs=request.chat_template_kwargs,
            tools=tools, documents=request.documents, reasoning_effort=request.reasoning_effort)
        prompt = self.prompts.from_text(rendered.prompt,
                                        add_special_tokens=request.add_special_tokens,
                                        truncate=request.truncate_prompt_tokens,
                                        side=request.truncation_side)
        prompt.text = rendered.prompt
        return prompt

    def sampling_params(self, request: ChatCompletionRequest, prompt: EnginePrompt) -> SamplingParams:
        requested: int | None
        if request.max_completion_tokens is not None:
            requested, parameter = request.max_completion_tokens, "max_completion_tokens"
        else:
            requested, parameter = request.max_tokens, "max_tokens"
        max_tokens = resolve_max_tokens(requested, parameter, len(prompt.token_ids),
                                        self.max_model_len, self.defaults)
        prompt_logprobs = request.prompt_logprobs
        if prompt_logprobs is None and request.echo:
            prompt_logprobs = request.top_logprobs
        params = build_sampling_params(
            request, max_tokens=max_tokens, prompt_logprobs=prompt_logprobs,
            logprobs=request.top_logprobs if request.logprobs and not request.logprob_token_ids
            else None, defaults=self.defaults)
        self.tools.constrain(request, params, prompt.text)  # required / named tool choice
        return self.tools.budget_thinking(request, params, prompt.text)

    def response_role(self, request: ChatCompletionRequest) -> str:
        if request.add_generation_prompt:
            return self.config.response_role
        return request.messages[-1].role

    def echo_text(self, request: ChatCompletionRequest) -> str:
        """With `echo`, the last message's content when it has the response's role."""
        last = request.messages[-1] if request.messages else None
        if not request.echo or last is None or last.role != self.response_role(request):
            return ""
        return content_text(last.content) or ""

    def choice_parts(self, ctx: ServeContext, delta: ChoiceDelta
                     ) -> tuple[str, ChatCompletionLogProbs | None, list[int] | None]:
        """Content, logprobs and token ids of a delta (or of a whole merged choice)."""
        request: ChatCompletionRequest = ctx.request
        logprobs = None
        if request.logprobs and request.top_logprobs is not None:
            num_top = self.engine.vocab_size if request.top_logprobs == -1 else request.top_logprobs
            if request.logprob_token_ids:  # the position holds the sampled token and those ids
                num_top = len(request.logprob_token_ids) + 1
            positions = positions_or_blank(delta.logprobs, len(delta.token_ids))
            logprobs = chat_logprobs(delta.token_ids, positions, num_top, self.tokenizer,
                                     as_token_ids=self.as_token_ids(request),
                                     stats=delta.token_stats)
        return delta.text, logprobs, delta.token_ids if request.return_token_ids else None

    # stage 6 -------------------------------------------------------------------------------

    async def build_response(self, ctx: ServeContext[ChatCompletionRequest]
                             ) -> ChatCompletionResponse:
        request, deltas = ctx.request, ctx.require_results()
        role, echo = self.response_role(request), self.echo_text(request)
        choices, reasoning_tokens = [], 0
        prompt = ctx.require_prompts()[0]
        for delta in deltas:
            text, logprobs, token_ids = self.choice_parts(ctx, delta)
            parser = self.tools.choice_parser(request, prompt.text)
            message, called, _ = chat_message(parser, role, echo, text, request)
            reasoning_tokens += self.tools.reasoning_tokens(parser, delta.token_ids, delta.text)
            choices.append(ChatCompletionResponseChoice(
                index=delta.index, message=message, logprobs=logprobs,
                finish_reason=parser.finish_reason(delta.finish_reason or "stop", called),
                stop_reason=delta.stop_reason, token_ids=token_ids, **inside_fields(delta)))
        usage = self.add_prompt_tokens_details(
            usage_info(len(prompt.token_ids), sum(len(d.token_ids) for d in deltas)), ctx)
        if self.tools.counts_reasoning:
            usage.completion_tokens_details = {"reasoning_tokens": reasoning_tokens}
        return ChatCompletionResponse(
            id=ctx.request_id, created=ctx.created, model=ctx.model_name, choices=choices,
            usage=usage,
            prompt_logprobs=prompt_logprobs_json(ctx.prompt_logprobs.get(0)),
            prompt_token_stats=token_stats_json(ctx.prompt_token_stats.get(0)),
            prompt_token_ids=prompt.token_ids if request.return_token_ids else None,
            prompt_text=prompt.text if request.return_prompt_text else None,
            system_fingerprint=self.system_fingerprint)

    async def create_stream(self, request: ChatCompletionRequest, meta: RequestMeta
                            ) -> AsyncIterator[str]:
        ctx = await self.prepare_off_loop(request, meta)
        await self.prime(ctx)
        return self._stream(ctx)

    def _chunk(self, ctx: ServeContext, choices: list[ChatCompletionResponseStreamChoice],
               **fields: Any) -> ChatCompletionStreamResponse:
        return ChatCompletionStreamResponse(id=ctx.request_id, object="chat.completion.chunk",
                                            created=ctx.created, model=ctx.model_name,
                                            choices=choices, **fields)

    def _opening(self, ctx: ServeContext, continuous: bool) -> list[str]:
        """The role chunk of every choice, then the echoed content if any."""
        request: ChatCompletionRequest = ctx.request
        prompt = ctx.require_prompts()[0]
        events = []
        for i in range(ctx.n):
            chunk = self._chunk(ctx, [ChatCompletionResponseStreamChoice(
                index=i, delta=DeltaMessage(role=self.response_role(request), content=""),
                logprobs=None, finish_reason=None)],
                prompt_token_ids=prompt.token_ids if request.return_token_ids else None,
                prompt_text=prompt.text if request.return_prompt_text else None)
            if continuous:
                chunk.usage = usage_info(len(prompt.token_ids), 0)
            events.append(chunk_json(chunk))
        echo = self.echo_text(request)
        for i in range(ctx.n if echo else 0):
            events.append(chunk_json(self._chunk(ctx, [ChatCompletionResponseStreamChoice(
                index=i, delta=DeltaMessage(content=echo), logprobs=None, finish_reason=None)])))
        return events

    async def _stream(self, ctx: ServeContext) -> AsyncIterator[str]:
        request: ChatCompletionRequest = ctx.request
        include_usage, continuous = usage_options(request.stream_options,
                                                  self.config.enable_force_include_usage)
        prompt = ctx.require_prompts()[0]
        num_prompt = len(prompt.token_ids)
        merged = {i: ChoiceDelta(index=i) for i in range(ctx.n)}
        parsers = {i: self.tools.choice_parser(request, prompt.text) for i in merged}
        for event in self._opening(ctx, continuous):  # prime() saw the first output
            yield event
        try:
            async with aclosing(self.streamed_deltas(ctx)) as deltas:
                async for delta in deltas:
                    so_far = merged[delta.index]
                    if not (delta.text or delta.token_ids or delta.finish_reason or so_far.token_ids):
                        continue  # nothing generated yet (a prefill step)
                    so_far.extend(delta)
                    text, logprobs, token_ids = self.choice_parts(ctx, delta)
                    message: DeltaMessage | None = DeltaMessage(content=text)
                    finish_reason = delta.finish_reason
                    parser = parsers[delta.index]
                    if parser.active:  # reasoning / tool calls out of the text so far
                        message, logprobs, token_ids, finish_reason = stream_parts(
                            parser, so_far, request, logprobs, token_ids)
                        if message is None and not (logprobs or token_ids or finish_reason):
                            continue
                    choice = ChatCompletionResponseStreamChoice(
                        index=delta.index, delta=message or DeltaMessage(), logprobs=logprobs,
                        finish_reason=finish_reason, token_ids=token_ids,
                        **inside_fields(delta))
                    if delta.finish_reason is not None:
                        choice.stop_reason = delta.stop_reason
                    chunk = self._chunk(ctx, [choice])
                    if continuous:
                        chunk.usage = usage_info(num_prompt, len(so_far.token_ids))
                    if delta.finish_reason is not None and not include_usage:
                        chunk.system_fingerprint = self.system_fingerprint  # the last word
                    yield chunk_json(chunk)
        except Exception as exc:  # noqa: BLE001 - the 200 is out: report in-band
            yield error_json(error_response(exc, log_stack=self.config.log_error_stack))
            return
        choices = ctx.final_res_batch = list(merged.values())
        self.finished(ctx, None)
        if include_usage:
            usage = self.add_prompt_tokens_details(
                usage_info(num_prompt, sum(len(c.token_ids) for c in choices)), ctx)
            if self.tools.counts_reasoning:
                usage.completion_tokens_details = {"reasoning_tokens": sum(
                    self.tools.reasoning_tokens(parsers[c.index], c.token_ids, c.text)
                    for c in choices)}
            yield usage_chunk_json(self._chunk(ctx, [], usage=usage,
                                               system_fingerprint=self.system_fingerprint))
