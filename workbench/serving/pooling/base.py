"""The pooling pipeline every pooling endpoint runs, as the reference's explicit stages.

    1. check model         unknown name -> 404 (param "model")
    2. validate            `validate` (endpoint hook): refused fields (`checks.py`)
    3. preprocess          `preprocess` (endpoint hook) -> `ctx.engine_prompts`: render chat
                           messages, tokenize, truncate, context-length rule naming the operation
    4. pooling params      `pooling_params` (endpoint hook) -> one `PoolingParams` per prompt
    5. prepare generators  one `engine.encode` per prompt, merged -> `ctx.result_generator`
    6. collect batch       the final output of every prompt -> `ctx.final_res_batch`
    7. build response      endpoint-specific

Each stage takes the `PoolingContext` and checks that the stages before it left what it needs,
with the reference's messages: preparing generators without prompts is "Engine prompts not
available"; collecting a context whose generators were never prepared (a dry run,
`prepare(..., schedule=False)`) is "Result generator not available"; a prompt whose request
ended without a result (aborted in the engine) is "Failed to generate results for all prompts".
All three are 400 `BadRequestError`, as the reference answers them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from workbench.serving.base import OpenAIServing, RequestMeta
from workbench.serving.errors import GenerationError
from workbench.serving.pooling.checks import PoolingPrompts
from workbench.serving.prompts import EnginePrompt
from workbench.serving.recorder import PipelineRecorder
from workbench.serving.streaming import merge_async_iterators
from workbench.serving.unsupported import refuse_unknown_fields

NO_PROMPTS = "Engine prompts not available"
NO_GENERATOR = "Result generator not available"
MISSING_RESULTS = "Failed to generate results for all prompts"


@dataclass
class PoolingContext:
    """One pooling request between its stages (the reference's `ServeContext`)."""

    request: Any
    request_id: str  # the response id, "embd-..." / "score-..." / ...
    model_name: str
    meta: RequestMeta = field(default_factory=RequestMeta)
    recorder: PipelineRecorder = field(default_factory=PipelineRecorder)
    engine_prompts: list[EnginePrompt] | None = None
    pooling_params: list[Any] | None = None  # one PoolingParams per engine prompt
    result_generator: AsyncIterator[tuple[int, Any]] | None = None
    final_res_batch: list[Any] | None = None  # one PoolingRequestOutput per engine prompt
    lora_request: Any = None  # the served adapter the request names (`workbench.lora`)
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.perf_counter)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p.token_ids) for p in self.engine_prompts or ())


class PoolingServing(OpenAIServing):
    supports_lora = True  # a served adapter's name runs it (generative models; vLLM's rule)
    """Stages 1-6 for pooling endpoints; subclasses supply the hooks and stage 7."""

    id_prefix = "pool"
    operation = "embedding generation"  # named by the context-length refusal

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.pooling_prompts = PoolingPrompts(self.prompts, self.operation)
        self.tasks = tuple(engine_attr(self.engine, "pooling_tasks", ()) or ())

    # -- hooks ------------------------------------------------------------------------------
    def validate(self, request: Any) -> None:
        """Stage 2 hook: refuse what this endpoint cannot honour."""

    def preprocess(self, ctx: PoolingContext) -> None:
        """Stage 3 hook: set `ctx.engine_prompts`."""
        raise NotImplementedError

    def pooling_params(self, ctx: PoolingContext) -> list[Any]:
        """Stage 4 hook: one `PoolingParams` per engine prompt."""
        raise NotImplementedError

    async def build_response(self, ctx: PoolingContext) -> Any:
        """Stage 7 hook: the response model from `ctx.final_res_batch`."""
        raise NotImplementedError

    # -- the pipeline -----------------------------------------------------------------------
    def context(self, request: Any, meta: RequestMeta | None = None) -> PoolingContext:
        meta = meta or RequestMeta()
        rec = meta.recorder if meta.recorder is not None else PipelineRecorder()
        request_id = self.base_request_id(meta, getattr(request, "request_id", None))
        return PoolingContext(request=request, request_id=f"{self.id_prefix}-{request_id}",
                              model_name=self.model_name, meta=meta, recorder=rec)

    def prepare(self, request: Any, meta: RequestMeta | None = None, *,
                schedule: bool = True) -> PoolingContext:
        """Stages 1-5; raises to end the request. `schedule=False` stops before the engine."""
        ctx = self.context(request, meta)
        rec = ctx.recorder
        with rec.stage("check model"), rec.check("model", "check model", "model"):
            self.check_model(request.model)
            ctx.lora_request = self.lora_request_for(request)
            if ctx.lora_request is not None:  # responses name the adapter, as vLLM's
                ctx.model_name = ctx.lora_request.lora_name
        with rec.check("headers", "check model"):
            self.check_headers(ctx.meta)
        with rec.stage("validate"), rec.check("supported fields", "validate"):
            refuse_unknown_fields(request)
            self.validate(request)
        rec.fields(request)
        with rec.stage("preprocess"), rec.check(
                f"inputs (tokenize, length for {self.operation})", "preprocess"):
            self.preprocess(ctx)
        with rec.stage("pooling params"), rec.check("pooling parameters", "pooling params"):
            ctx.pooling_params = self.pooling_params(ctx)
        if schedule:
            with rec.stage("prepare generators"):
                self.prepare_generators(ctx)
        return ctx

    async def create(self, request: Any, meta: RequestMeta | None = None) -> Any:
        """The whole pipeline: the response model, or an exception for the error envelope.
        Stages 1-4 (tokenizing: CPU work) run in the server's thread pool, off the loop."""
        ctx = await self.cpu.run(self.prepare, request, meta, schedule=False)
        with ctx.recorder.stage("prepare generators"):
            self.prepare_generators(ctx)
        with ctx.recorder.stage("collect batch"):
            await self.collect_batch(ctx)
        with ctx.recorder.stage("build response"):
            response = await self.build_response(ctx)
        self.finished(ctx)
        return response

    def engine_request_id(self, ctx: PoolingContext, index: int) -> str:
        """Unique whatever id the client sent (see `base.unique_engine_id`)."""
        from workbench.serving.base import unique_engine_id

        return unique_engine_id(f"{ctx.request_id}-{index}")

    def prepare_generators(self, ctx: PoolingContext) -> None:
        """Stage 5: one engine request per prompt, merged; nothing runs until iterated."""
        if ctx.engine_prompts is None:
            raise ValueError(NO_PROMPTS)
        if ctx.pooling_params is None or len(ctx.pooling_params) != len(ctx.engine_prompts):
            raise ValueError("Pooling parameters not available for every prompt")
        priority = ctx.meta.int_header("x-vllm-priority")
        priority = getattr(ctx.request, "priority", 0) if priority is None else priority
        streams = []
        for i, (prompt, params) in enumerate(zip(ctx.engine_prompts, ctx.pooling_params)):
            engine_id = self.engine_request_id(ctx, i)
            if self.request_logger is not None:
                self.request_logger.log_inputs(engine_id, prompt.text, prompt.token_ids, params)
            streams.append(self._encode_stream(prompt, params, engine_id, priority,
                                               ctx.lora_request))
        ctx.result_generator = merge_async_iterators(*streams)

    async def _encode_stream(self, prompt: EnginePrompt, params: Any, request_id: str,
                             priority: int, lora_request: Any = None) -> AsyncIterator[Any]:
        """One engine request; its final output only when it carries a result."""
        kwargs = {} if lora_request is None else {"lora_request": lora_request}
        async with aclosing(self.engine.encode(prompt.as_engine_input(), params, request_id,
                                               priority=priority, **kwargs)) as outputs:
            async for output in outputs:
                if not output.finished:
                    continue
                reason = getattr(output, "finish_reason", "stop")
                if reason == "error":
                    raise GenerationError()
                if reason == "stop":  # "abort": no result, so collect_batch reports it missing
                    yield output

    async def collect_batch(self, ctx: PoolingContext) -> None:
        """Stage 6: every prompt's final output, in prompt order."""
        if ctx.engine_prompts is None:
            raise ValueError(NO_PROMPTS)
        if ctx.result_generator is None:
            raise ValueError(NO_GENERATOR)
        results: list[Any] = [None] * len(ctx.engine_prompts)
        async with aclosing(ctx.result_generator) as outputs:
            async for index, output in outputs:
                ctx.recorder.output(index, output)
                results[index] = output
        if any(r is None for r in results):
            raise ValueError(MISSING_RESULTS)
        ctx.final_res_batch = results

    def finished(self, ctx: PoolingContext) -> None:
        """Metrics and the request log, once per request."""
        ctx.recorder.finished_at = time.time()
        n = len(ctx.engine_prompts or ())
        if self.metrics is not None:
            self.metrics.finished(time.perf_counter() - ctx.started, ctx.num_prompt_tokens, 0,
                                  ["stop"] * n)
        if self.request_logger is not None:
            self.request_logger.log_outputs(ctx.request_id, [""] * n, ["stop"] * n)

    # -- shared helpers ---------------------------------------------------------------------
    def check_task(self, task: str) -> None:
        """The reference's refusal of a task the model does not serve."""
        if task not in self.tasks:
            raise ValueError(f"Unsupported task: {task!r} Supported tasks: {self.tasks}")

    def text_or_chat_prompts(self, request: Any) -> list[EnginePrompt]:
        """`input` (text / ids / lists) or chat `messages` (one conversation or a batch),
        tokenized and length-checked."""
        if getattr(request, "messages", None) is not None:
            return self.pooling_prompts.from_chat(self.renderer, request)
        return self.pooling_prompts.from_input(
            request.input, add_special_tokens=request.add_special_tokens,
            truncate=request.truncate_prompt_tokens, side=request.truncation_side)

    @property
    def renderer(self) -> Any:
        from workbench.serving.chat_template import ChatRenderer

        if not hasattr(self, "_renderer"):
            self._renderer = ChatRenderer(
                self.tokenizer, chat_template=self.config.chat_template,
                trust_request_chat_template=self.config.trust_request_chat_template,
                default_chat_template_kwargs=self.config.default_chat_template_kwargs)
        return self._renderer


def engine_attr(engine: Any, name: str, default: Any) -> Any:
    """An engine fact (`pooling_tasks`, `is_pooling_model`, `classifier_labels`) from an
    `AsyncLLMEngine` or the `LLMEngine` under it."""
    for obj in (engine, getattr(engine, "engine", None)):
        if obj is not None and hasattr(obj, name):
            return getattr(obj, name)
    return default
