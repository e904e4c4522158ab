"""`ResponsesServing`: `POST /v1/responses`, retrieval and cancel, on the serving pipeline.

The pipeline's stages (`base.OpenAIServing`), with the hooks of a response:

    check model, headers -> validate: the request's checks -> preprocess: the previous
    response (404 if unknown), conversation = stored history + input, tools (function +
    built-in), the claimed id, the first prompt -> prepare generators: the `ToolLoop` (rounds
    of generate / built-in tools) -> collect -> the response, stored when asked

`create` returns the `ResponsesResponse` (with `background`, at once as `queued`, the loop then
running as a task until the stored response is `completed`, `failed` or `cancelled`);
`create_stream` returns its events as dicts
(`response.created`, `response.in_progress`, the items' events, `response.completed`) with
a `sequence_number` counting from 0; the HTTP layer writes them as `event:` / `data:` pairs.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import weakref
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

from workbench.engine.protocol import EngineClient
from workbench.errors import ValidationError
from workbench.serving.base import OpenAIServing, RequestMeta, ServeContext
from workbench.serving.chat_template import ChatRenderer
from workbench.serving.errors import ServingError, error_response, make_error
from workbench.serving.protocol.responses import (
    IncompleteDetails,
    InputTokensDetails,
    OutputTokensDetails,
    ResponsesRequest,
    ResponsesResponse,
    ResponseStatus,
    ResponseUsage,
)
from workbench.serving.responses import checks
from workbench.serving.responses.items import conversation
from workbench.serving.responses.loop import ToolLoop, ToolSet, sampling_params
from workbench.serving.responses.store import ResponseStore
from workbench.serving.unsupported import refuse_unknown_fields
from workbench.tools.base import ToolServer, default_tool_server


def not_found(response_id: str) -> ServingError:
    return ServingError(make_error(f"Response with id '{response_id}' not found.",
                                   "invalid_request_error", HTTPStatus.NOT_FOUND, "response_id"))


class ResponsesServing(OpenAIServing):
    id_prefix = "resp"
    supports_lora = True  # a served adapter's name runs every round with it, as vLLM

    def __init__(self, engine: EngineClient, config: Any = None, metrics: Any = None, *,
                 tool_server: ToolServer | None = None, store: ResponseStore | None = None):
        super().__init__(engine, config, metrics)
        self.renderer = ChatRenderer.for_server(self.tokenizer, self.config)
        self.tool_server = tool_server if tool_server is not None else default_tool_server()
        self.store = store if store is not None else ResponseStore(self.config.responses_store_size)
        self.tool_parser_name = getattr(self.config, "tool_call_parser", None)
        self.auto_tools = getattr(self.config, "enable_auto_tool_choice", False)
        self.reasoning_parser_name = getattr(self.config, "reasoning_parser", None)
        self._background: dict[str, asyncio.Task] = {}  # running background responses
        self._running: set[str] = set()  # ids of responses whose loop is alive
        self._claims = threading.Lock()  # `preprocess` runs in the preprocessing pool's threads

    # -- the pipeline's hooks -------------------------------------------------------------
    def context(self, request: ResponsesRequest, meta: RequestMeta | None = None
                ) -> ServeContext[ResponsesRequest]:
        """`resp_<id>`: the client's id (a `resp_` one as it is), else a uuid."""
        ctx = super().context(request, meta)
        base = self.base_request_id(ctx.meta, request.request_id)
        ctx.request_id = base if base.startswith("resp_") else f"resp_{base}"
        return ctx

    def validate(self, ctx: ServeContext[ResponsesRequest]) -> None:
        self.engine.check_health()  # a dead engine: 500 before any stream starts
        refuse_unknown_fields(ctx.request)
        checks.check_request(ctx.request, store_enabled=self.store.enabled)

    def preprocess(self, ctx: ServeContext[ResponsesRequest]) -> None:
        """The conversation (stored history + input), its tools, the claimed response id,
        the `ToolLoop` and its first prompt (`ctx.loop`, `ctx.engine_prompts`)."""
        request = ctx.request
        history = []
        if request.previous_response_id is not None:
            previous = self.store.get(request.previous_response_id)
            if previous is None:
                raise not_found(request.previous_response_id)
            history = previous.conversation
        tools = ToolSet.build(request.tools, self.tool_server)
        checks.check_tool_choice(request, tools, auto_tools=self.auto_tools,
                                 tool_parser_name=self.tool_parser_name)
        sampling_params(request, 1, self.defaults).verify(self.engine.vocab_size,
                                                           self.engine.config.max_logprobs)
        header_priority = ctx.meta.int_header("x-vllm-priority")
        response_id = self.claim_id(ctx.request_id)
        try:
            loop = ToolLoop(self, request, response_id, conversation(request.input, history),
                            tools, request.priority if header_priority is None else header_priority)
        except BaseException:
            self._running.discard(response_id)
            raise
        weakref.finalize(loop, self._running.discard, response_id)  # released with its loop
        ctx.loop = loop
        prompt = loop.first_prompt()
        if loop.constraint is not None:
            self.check_grammar(loop, prompt)
        ctx.engine_prompts = [prompt]

    def build_params(self, ctx: ServeContext[ResponsesRequest]) -> list[Any]:
        """The first round's parameters (checked in `preprocess`, before the id is claimed);
        later rounds make their own (`ToolLoop`)."""
        return [sampling_params(ctx.request, 1, self.defaults)]

    def prepare_generators(self, ctx: ServeContext[ResponsesRequest]) -> None:
        """The tool loop's rounds from the first prompt: lists of stream events. The response's
        clock starts here, once the request is checked."""
        ctx.started, ctx.created = time.perf_counter(), int(time.time())
        ctx.result_generator = ctx.loop.run(ctx.require_prompts()[0])

    async def collect(self, ctx: ServeContext[ResponsesRequest]) -> None:
        async for _ in ctx.require_generator():
            pass

    async def build_response(self, ctx: ServeContext[ResponsesRequest]) -> ResponsesResponse:
        return self.build(ctx.loop, ctx.created)

    def check_grammar(self, loop: ToolLoop, prompt: Any) -> None:
        """The engine's input checks on the first round, without queueing anything: a schema
        the backend can't take is a 400 before a stream starts (as chat's `prime`)."""
        params = sampling_params(loop.request, 1, self.defaults)
        params.structured_outputs = loop.constraint
        self.engine.check_inputs(f"{loop.response_id}_check", prompt.as_engine_input(), params)

    def claim_id(self, response_id: str) -> str:
        """A client-chosen id (`request_id`, `X-Request-Id`) names one response: an id that is
        stored or still running is refused, never overwritten."""
        with self._claims:
            if response_id in self._running or response_id in self.store:
                raise ValidationError(f"request_id '{response_id}' is already in use by another "
                                      "response; send a new id.", parameter="request_id")
            self._running.add(response_id)
        return response_id

    def engine_stream(self, prompt: Any, params: Any, request_id: str, priority: int,
                      lora_request: Any = None):
        """One round's engine request, aborted if its consumer goes away (see `base.py`);
        logged with `--enable-log-requests` under its sub-request id."""
        if self.request_logger is not None:
            self.request_logger.log_inputs(request_id, prompt.text, prompt.token_ids, params)
        return super().engine_stream(prompt, params, request_id, priority, lora_request)

    # -- responses ----------------------------------------------------------------------------
    async def create(self, request: ResponsesRequest, meta: RequestMeta | None = None
                     ) -> ResponsesResponse:
        if request.background:
            return await self.start_background(request, meta)
        return await super().create(request, meta)

    async def run(self, request: ResponsesRequest, meta: RequestMeta
                  ) -> tuple[ResponsesResponse, ToolLoop]:
        """The response and the loop that made it (its rounds: `ToolLoopTrace.from_loop`)."""
        ctx = await self.prepare_off_loop(request, meta)  # render, tokenize off the loop
        return await self.complete(ctx), ctx.loop

    async def create_stream(self, request: ResponsesRequest, meta: RequestMeta
                            ) -> AsyncIterator[dict[str, Any]]:
        return self._stream(await self.prepare_off_loop(request, meta))

    async def _stream(self, ctx: ServeContext[ResponsesRequest]
                      ) -> AsyncIterator[dict[str, Any]]:
        numbers = itertools.count()
        opening = self.build(ctx.loop, ctx.created, status="in_progress").model_dump(mode="json")
        for kind in ("response.created", "response.in_progress"):
            yield {"type": kind, "sequence_number": next(numbers), "response": opening}
        try:
            async for events in ctx.require_generator():
                for event in events:
                    yield {**event, "sequence_number": next(numbers)}
        except Exception as exc:  # noqa: BLE001 - the 200 is out: report in-band
            error = error_response(exc, log_stack=self.config.log_error_stack).error
            yield {"type": "error", "sequence_number": next(numbers), "code": str(error.code),
                   "message": error.message, "param": error.param}
            return
        response = await self.build_response(ctx)
        self.finished(ctx, response)
        yield {"type": "response.completed", "sequence_number": next(numbers),
               "response": response.model_dump(mode="json")}

    def finished(self, ctx: ServeContext[ResponsesRequest], response: ResponsesResponse) -> None:
        """Stored when asked; metrics and the span, once per response."""
        loop, elapsed = ctx.loop, time.perf_counter() - ctx.started
        if response.store:
            self.store.put(response, loop.conversation)
        if self.metrics is not None:
            usage = response.usage
            assert usage is not None, "a finished response has its usage (see `build`)"
            self.metrics.finished(elapsed, usage.input_tokens, usage.output_tokens,
                                  [loop.rounds[-1].finish_reason] if loop.rounds else [])
        if self.tracer is not None:
            self.tracer.record_response(response, loop, elapsed, ctx.headers)

    def build(self, loop: ToolLoop, created: int, status: ResponseStatus | None = None
              ) -> ResponsesResponse:
        request = loop.request
        params = sampling_params(request, 1, self.defaults)
        incomplete = (IncompleteDetails(reason=loop.incomplete_reason)
                      if loop.incomplete_reason and status is None else None)
        output = [] if status is not None else loop.builder.items
        return ResponsesResponse(
            id=loop.response_id, created_at=created, status=status or loop.status,
            background=bool(request.background),
            incomplete_details=incomplete, instructions=request.instructions,
            max_output_tokens=request.max_output_tokens, max_tool_calls=request.max_tool_calls,
            metadata=request.metadata, output=output,
            model=loop.lora_request.lora_name if loop.lora_request else self.model_name,
            parallel_tool_calls=request.parallel_tool_calls is not False,
            previous_response_id=request.previous_response_id, reasoning=request.reasoning,
            service_tier=request.service_tier,
            store=bool(request.store) and self.store.enabled, temperature=params.temperature,
            text=request.text or {"format": {"type": "text"}}, tool_choice=request.tool_choice,
            tools=request.tools, top_logprobs=request.top_logprobs, top_p=params.top_p,
            truncation=request.truncation, user=request.user,
            usage=None if status is not None else self.usage(loop),
            input_messages=loop.input_messages if request.enable_response_messages else None,
            output_messages=(loop.conversation[len(loop.input_messages):]
                             if request.enable_response_messages else None))

    def usage(self, loop: ToolLoop) -> ResponseUsage:
        rounds = loop.rounds
        inputs = [r.prompt_tokens for r in rounds]
        outputs = [r.output_tokens for r in rounds]
        return ResponseUsage(
            input_tokens=sum(inputs), output_tokens=sum(outputs),
            total_tokens=sum(inputs) + sum(outputs),
            input_tokens_details=InputTokensDetails(input_tokens_per_turn=inputs),
            output_tokens_details=OutputTokensDetails(
                reasoning_tokens=sum(r.reasoning_tokens for r in rounds),
                tool_output_tokens=sum(r.tool_output_tokens for r in rounds),
                output_tokens_per_turn=outputs,
                tool_output_tokens_per_turn=[r.tool_output_tokens for r in rounds]))

    # -- stored responses ---------------------------------------------------------------------
    def retrieve(self, response_id: str, stream: bool | None = None) -> ResponsesResponse:
        entry = self.store.get(response_id)
        if entry is None:
            raise not_found(response_id)
        if stream:  # only background responses replay their events (the reference's message)
            raise ValidationError(f"Unknown response_id: {response_id}",
                                         parameter="response_id", value=response_id)
        return entry.response

    async def cancel(self, response_id: str) -> ResponsesResponse:
        """Cancels a queued or running background response (its engine requests abort)."""
        entry = self.store.get(response_id)
        if entry is None:
            raise not_found(response_id)
        if entry.response.status not in ("queued", "in_progress"):
            raise ServingError(make_error("Cannot cancel a synchronous response.",
                                          "invalid_request_error", param="response_id"))
        cancelled = entry.response.model_copy(update={"status": "cancelled"})
        self.store.put(cancelled, entry.conversation)
        task = self._background.get(response_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return cancelled

    # -- background responses -------------------------------------------------------------------
    async def start_background(self, request: ResponsesRequest, meta: RequestMeta | None
                               ) -> ResponsesResponse:
        """`background=true`: stored as `queued` and answered at once; the loop runs as a task
        of this event loop, and the stored response becomes `completed` (or `failed`)."""
        if request.stream:
            raise ValidationError(f"`background` with `stream` {checks.NOT_YET}.",
                                  parameter="background")
        ctx = await self.prepare_off_loop(request, meta)
        loop = ctx.loop
        queued = self.build(loop, ctx.created, status="queued")
        self.store.put(queued, loop.input_messages)
        task = asyncio.get_running_loop().create_task(self._background_run(ctx))
        self._background[loop.response_id] = task
        task.add_done_callback(lambda _: self._background.pop(loop.response_id, None))
        return queued

    async def _background_run(self, ctx: ServeContext[ResponsesRequest]) -> None:
        loop = ctx.loop
        ctx.started = time.perf_counter()
        self.store.put(self.build(loop, ctx.created, status="in_progress"), loop.input_messages)
        try:
            await self.collect(ctx)
        except asyncio.CancelledError:
            raise  # `cancel` stored the cancelled response
        except Exception as exc:  # noqa: BLE001 - a background failure is stored, not raised
            error = error_response(exc).error
            failed = self.build(loop, ctx.created, status="failed").model_copy(
                update={"error": {"code": str(error.code), "message": error.message}})
            self.store.put(failed, loop.input_messages)
            return
        self.finished(ctx, await self.build_response(ctx))
