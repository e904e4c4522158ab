"""The pooling side of the one pipeline (`base.OpenAIServing`), as the reference's stages.

    1. check model         unknown name -> 404 (param "model")
    2. validate            unknown fields, then the endpoint's refusals (`checks.py`)
    3. preprocess          endpoint hook -> `ctx.engine_prompts`: render chat messages,
                           tokenize, truncate, context-length rule naming the operation;
       pooling params      `build_params` (endpoint hook) -> one `PoolingParams` per prompt
    4. prepare generators  one `engine.encode` per prompt, merged -> `ctx.result_generator`
    5. collect batch       the final output of every prompt -> `ctx.final_res_batch`
    6. build response      endpoint hook

Each stage takes the `ServeContext` and checks that the stages before it left what it needs,
with the reference's messages: preparing generators without prompts is "Engine prompts not
available"; collecting a context whose generators were never prepared (a dry run,
`prepare(..., schedule=False)`) is "Result generator not available"; a prompt whose request
ended without a result (aborted in the engine) is "Failed to generate results for all prompts".
All three are 400 `BadRequestError`, as the reference answers them. With tracing on, each
finished request is one span, its stages as events (`tracing.py`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, cast

from workbench.serving.base import OpenAIServing, unique_engine_id
from workbench.serving.chat_template import ChatRenderer
from workbench.serving.context import ServeContext
from workbench.serving.errors import GenerationError
from workbench.serving.pooling.checks import PoolingPrompts
from workbench.serving.prompts import EnginePrompt
from workbench.serving.streaming import ChoiceDelta, merge_async_iterators
from workbench.serving.unsupported import refuse_unknown_fields

NO_PROMPTS = "Engine prompts not available"
NO_GENERATOR = "Result generator not available"
MISSING_RESULTS = "Failed to generate results for all prompts"


class PoolingServing(OpenAIServing):
    """The pooling side of the pipeline; endpoints supply the request-specific hooks."""

    supports_lora = True  # a served adapter's name runs it (generative models; vLLM's rule)
    id_prefix = "pool"
    operation = "embedding generation"  # named by the context-length refusal
    params_stage = ("pooling params", "pooling parameters")
    records_final_stages = True

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.pooling_prompts = PoolingPrompts(self.prompts, self.operation)
        self.preprocess_check = f"inputs (tokenize, length for {self.operation})"

    @property
    def tasks(self) -> tuple[str, ...]:
        """The pooling tasks the engine's model serves."""
        return tuple(self.engine.pooling_tasks)

    def validate(self, ctx: ServeContext) -> None:
        """Stage 2: unknown fields; endpoints add their own refusals after these."""
        refuse_unknown_fields(ctx.request)

    def engine_request_id(self, ctx: ServeContext, index: int) -> str:
        """Unique whatever id the client sent (see `base.unique_engine_id`)."""
        return unique_engine_id(f"{ctx.request_id}-{index}")

    def prepare_generators(self, ctx: ServeContext) -> None:
        """Stage 4: one `engine.encode` per prompt, merged; nothing runs until iterated."""
        if ctx.engine_prompts is None:
            raise ValueError(NO_PROMPTS)
        if ctx.params is None or len(ctx.params) != len(ctx.engine_prompts):
            raise ValueError("Pooling parameters not available for every prompt")
        priority = ctx.meta.int_header("x-vllm-priority")
        priority = getattr(ctx.request, "priority", 0) if priority is None else priority
        streams = []
        for i, (prompt, params) in enumerate(zip(ctx.engine_prompts, ctx.params)):
            engine_id = self.engine_request_id(ctx, i)
            if self.request_logger is not None:
                self.request_logger.log_inputs(engine_id, prompt.text, prompt.token_ids, params)
            streams.append(self._encode_stream(prompt, params, engine_id, priority,
                                               ctx.lora_request))
        ctx.result_generator = merge_async_iterators(*streams)

    async def _encode_stream(self, prompt: EnginePrompt, params: Any, request_id: str,
                             priority: int, lora_request: Any = None) -> AsyncGenerator[Any, None]:
        """One engine request; its final output only when it carries a result."""
        kwargs = {} if lora_request is None else {"lora_request": lora_request}
        # `EngineClient.encode` is declared an AsyncIterator; every engine's is an async
        # generator, which `aclosing` needs
        stream = cast(AsyncGenerator[Any, None],
                      self.engine.encode(prompt.as_engine_input(), params, request_id,
                                         priority=priority, **kwargs))
        async with aclosing(stream) as outputs:
            async for output in outputs:
                if not output.finished:
                    continue
                reason = getattr(output, "finish_reason", "stop")
                if reason == "error":
                    raise GenerationError()
                if reason == "stop":  # "abort": no result, so collect reports it missing
                    yield output

    async def collect(self, ctx: ServeContext) -> None:
        """Stage 5: every prompt's final output, in prompt order -> `ctx.final_res_batch`."""
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

    def finished(self, ctx: ServeContext, response: Any) -> None:
        """Metrics, the request log and the span, once per request."""
        ctx.recorder.finished_at = time.time()
        n = len(ctx.engine_prompts or ())
        if self.metrics is not None:
            self.metrics.finished(time.perf_counter() - ctx.started, ctx.num_prompt_tokens, 0,
                                  ["stop"] * n)
        if self.request_logger is not None:
            self.request_logger.log_outputs(ctx.request_id, [""] * n, ["stop"] * n)
        if self.tracer is not None:
            self.tracer.record(ctx, [ChoiceDelta(index=i, finish_reason="stop")
                                     for i in range(n)])

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
        if not hasattr(self, "_renderer"):
            self._renderer = ChatRenderer.for_server(self.tokenizer, self.config)
        return self._renderer

