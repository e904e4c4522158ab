"""The one serving pipeline of every endpoint that runs the engine, as explicit stages.

    1. check model        `check_model`: unknown name -> 404 NotFoundError (param "model");
                          the adapter a served adapter's name runs with
    2. validate           `validate(ctx)` hook: refused fields, template trust, ...
    3. preprocess         `preprocess(ctx)` hook -> `ctx.engine_prompts` (render, tokenize,
                          context-length rules); then `build_params(ctx)` -> `ctx.params`
    4. prepare generators `prepare_generators(ctx)` hook -> `ctx.result_generator`
    5. collect            `collect(ctx)` hook (non-streaming)
    6. build response     `build_response(ctx)` hook, then `finished(ctx, response)`

One context type, `ServeContext[RequestT]` (`context.py`), and one set of hook signatures for
generation (`generation.py`: completions, chat), pooling (`pooling/base.py`) and Responses
(`responses/serving.py`), as vLLM's `OpenAIServing`. Any stage ends the request by raising;
`errors.error_response` turns the exception into the error envelope. Every check, coercion and
ignored field, the stage timings and the engine's outputs go into the request's
`PipelineRecorder` (`recorder.py`; `RequestMeta.recorder` to pass your own), from which
`workbench.inspect` builds `ValidationReport` and `Trace`; `prepare(..., schedule=False)` is
the dry run behind `validate`. Request ids come from `X-Request-Id` (else the body's
`request_id`, else a uuid); `X-data-parallel-rank` and `X-Vllm-Priority` are parsed from
headers (invalid values ignored); with `--otlp-traces-endpoint` each finished request is a
span (`tracing.py`), a child of the `traceparent` it came with; without it, trace headers get
a one-time warning. The engine is reached only through `EngineClient` (`engine/protocol.py`).
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import logging
import secrets
import uuid
from collections.abc import AsyncGenerator
from contextlib import nullcontext
from typing import Any

from workbench.engine.protocol import EngineClient
from workbench.errors import NotFoundError
from workbench.serving.config import ServerConfig
from workbench.serving.context import RequestMeta, ServeContext
from workbench.serving.metrics import ServingMetrics
from workbench.serving.offload import CpuPool
from workbench.serving.prompts import EnginePrompt, PromptTokenizer
from workbench.serving.recorder import PipelineRecorder
from workbench.serving.request_logger import RequestLogger
from workbench.serving.sampling import server_defaults
from workbench.version import __version__

__all__ = ["EngineServing", "OpenAIServing", "RequestMeta", "ServeContext", "fingerprint",
           "unique_engine_id"]

logger = logging.getLogger("workbench.serving")
_TRACE_HEADERS = ("traceparent", "tracestate")


def fingerprint(engine: EngineClient) -> str:
    """`workbench-<version>-<hash8>` of what shapes outputs (the model, dtype, context), like
    vLLM's `vllm-<version>-<hash8>`: equal fingerprints, same backend configuration."""
    config = engine.config
    what = repr((engine.model_path, config.dtype, engine.max_model_len, config.seed)
                + ((config.gguf_activations,) if getattr(config, "gguf_activations", "float32")
                   != "float32" else ()))  # llama.cpp's int8 arithmetic: other outputs
    return f"workbench-{__version__}-{hashlib.sha256(what.encode()).hexdigest()[:8]}"


class EngineServing:
    """What every endpoint needs: the engine, the served names, ids, headers, logging."""

    def __init__(self, engine: EngineClient, config: ServerConfig | None = None,
                 metrics: ServingMetrics | None = None):
        self.engine = engine
        self.config = config or ServerConfig()
        self.served_model_names = self.config.served_model_names or (engine.served_model_name,)
        self.model_name = self.served_model_names[0]
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.prompts = PromptTokenizer(engine.tokenizer, engine.max_model_len, engine.vocab_size)
        self.defaults = server_defaults(engine.generation_defaults)
        self.metrics = metrics
        self.request_logger = (RequestLogger(self.config.max_log_len)
                               if self.config.enable_log_requests else None)
        self._warned_trace = False
        self.system_fingerprint = fingerprint(engine)
        self.cpu = CpuPool()  # tokenizing and rendering off the loop; `Servings` shares one

    adapters = None  # `workbench.serving.lora.ServedAdapters`, shared by a server's endpoints
    tracer = None  # `tracing.RequestTracer` with --otlp-traces-endpoint, shared likewise
    supports_lora = False  # endpoints that run a request's adapter set this

    def check_model(self, model: str | None) -> None:
        """Stage 1. Null means the first served name; an adapter's name (served, or found by
        a resolver) passes on endpoints that run adapters."""
        if not model or model in self.served_model_names:
            return
        if self.supports_lora and self.adapters is not None and self.adapters.knows(model):
            return
        raise NotFoundError(f"The model `{model}` does not exist. Valid aliases: "
                            f"{', '.join(self.served_model_names)}.", parameter="model")

    def base_request_id(self, meta: RequestMeta, body_id: str | None) -> str:
        return meta.header("x-request-id") or body_id or uuid.uuid4().hex

    def check_headers(self, meta: RequestMeta) -> None:
        """Data-parallel rank (one rank here) and trace headers."""
        rank = meta.int_header("x-data-parallel-rank")
        if rank is not None and rank != 0:
            raise ValueError(f"data_parallel_rank {rank} is out of range [0, 1).")
        if (self.tracer is None and not self._warned_trace
                and any(meta.header(h) for h in _TRACE_HEADERS)):
            self._warned_trace = True
            logger.warning("Received a request with trace context but tracing is disabled; "
                           "the traceparent/tracestate headers are not propagated.")

    def lora_request_for(self, request: Any) -> Any:
        """The adapter a checked request runs with (vLLM's `_maybe_get_adapters`)."""
        if not self.supports_lora or self.adapters is None:
            return None
        return self.adapters.adapter_for(getattr(request, "model", None),
                                         self.content_types(request))

    def content_types(self, request: Any) -> set[str] | None:
        """Content-part types that pick a default adapter (chat only)."""
        return None

    def as_token_ids(self, request: Any) -> bool:
        value = getattr(request, "return_tokens_as_token_ids", None)
        return self.config.return_tokens_as_token_ids if value is None else value


class OpenAIServing(EngineServing, abc.ABC):
    """Stages 1-6 for every endpoint that runs the engine; subclasses implement the hooks."""

    id_prefix = "cmpl"
    preprocess_check = "prompt (chat template, tokenize, input length)"  # stage 3's check
    params_stage = ("sampling params", "sampling parameters")  # the stage, its check
    records_final_stages = False  # stages 5-6 in the recorder (generation: engine phases)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._aborts: set[asyncio.Task] = set()

    # -- hooks ------------------------------------------------------------------------------
    @abc.abstractmethod
    def validate(self, ctx: ServeContext) -> None:
        """Stage 2: refuse what this endpoint cannot honour."""

    @abc.abstractmethod
    def preprocess(self, ctx: ServeContext) -> None:
        """Stage 3: set `ctx.engine_prompts` (tokenized, length-checked)."""

    @abc.abstractmethod
    def build_params(self, ctx: ServeContext) -> list[Any]:
        """Stage 3: one `SamplingParams` / `PoolingParams` per engine prompt."""

    @abc.abstractmethod
    def prepare_generators(self, ctx: ServeContext) -> None:
        """Stage 4: set `ctx.result_generator`; nothing runs until it is iterated."""

    @abc.abstractmethod
    async def collect(self, ctx: ServeContext) -> None:
        """Stage 5 (non-streaming): run the generators to the end -> `ctx.final_res_batch`."""

    @abc.abstractmethod
    async def build_response(self, ctx: ServeContext) -> Any:
        """Stage 6: the response model."""

    @abc.abstractmethod
    def finished(self, ctx: ServeContext, response: Any) -> None:
        """Once per request that ended well: metrics, the request log, the span."""

    def dry_run(self, ctx: ServeContext) -> None:
        """Stage 4 without queueing (`prepare(..., schedule=False)`): the engine's own input
        checks where the endpoint has them; none by default."""

    def engine_request_id(self, ctx: ServeContext, index: int) -> str:
        """The engine's id of prompt `index` (before `unique_engine_id`)."""
        return f"{ctx.request_id}-{index}"

    # -- the pipeline -----------------------------------------------------------------------
    def context(self, request: Any, meta: RequestMeta | None = None) -> ServeContext:
        """A fresh context: its recorder (`meta.recorder`, else a new one) and response id."""
        meta = meta or RequestMeta()
        rec = meta.recorder if meta.recorder is not None else PipelineRecorder()
        request_id = self.base_request_id(meta, getattr(request, "request_id", None))
        return ServeContext(request=request, request_id=f"{self.id_prefix}-{request_id}",
                            model_name=self.model_name, meta=meta, recorder=rec)

    def build_context(self, request: Any, meta: RequestMeta | None = None) -> ServeContext:
        """Stages 1-3: the checked request as a context, nothing queued yet."""
        ctx = self.context(request, meta)
        rec = ctx.recorder
        with rec.stage("check model"), rec.check("model", "check model", "model"):   # 1
            self.check_model(request.model)
            ctx.lora_request = self.lora_request_for(request)
            if ctx.lora_request is not None:  # responses name the adapter, as vLLM's
                ctx.model_name = ctx.lora_request.lora_name
        with rec.check("headers", "check model"):
            self.check_headers(ctx.meta)
        with rec.stage("validate"), rec.check("supported fields", "validate"):        # 2
            self.validate(ctx)
        rec.fields(request)
        with rec.stage("preprocess"), rec.check(self.preprocess_check, "preprocess"):  # 3
            self.preprocess(ctx)
        stage, check = self.params_stage
        with rec.stage(stage), rec.check(check, stage):
            ctx.params = self.build_params(ctx)
        return ctx

    def schedule(self, ctx: ServeContext) -> None:
        """Stage 4, timed in the recorder."""
        with ctx.recorder.stage("prepare generators"):
            self.prepare_generators(ctx)

    def prepare(self, request: Any, meta: RequestMeta | None = None, *,
                schedule: bool = True) -> ServeContext:
        """Stages 1-4; raises to end the request. `schedule=False` is the dry run of
        `validate`: every check recorded, nothing queued."""
        ctx = self.build_context(request, meta)
        if schedule:
            self.schedule(ctx)
        else:
            self.dry_run(ctx)
        return ctx

    async def prepare_off_loop(self, request: Any, meta: RequestMeta | None = None
                               ) -> ServeContext:
        """`prepare` for a server: stages 1-3 (templates, tokenizer: CPU-heavy) run in the
        server's thread pool, so the event loop stays free; stage 4 on the loop."""
        ctx = await self.cpu.run(self.build_context, request, meta)
        self.schedule(ctx)
        return ctx

    async def create(self, request: Any, meta: RequestMeta | None = None) -> Any:
        """The whole pipeline, non-streaming: the response model, or an exception for the
        error envelope."""
        return await self.complete(await self.prepare_off_loop(request, meta))

    async def complete(self, ctx: ServeContext) -> Any:
        """Stages 5-6 of a scheduled context."""
        with self._final_stage(ctx, "collect batch"):
            await self.collect(ctx)
        with self._final_stage(ctx, "build response"):
            response = await self.build_response(ctx)
        self.finished(ctx, response)
        return response

    def _final_stage(self, ctx: ServeContext, name: str) -> Any:
        return ctx.recorder.stage(name) if self.records_final_stages else nullcontext()

    # -- engine streams ---------------------------------------------------------------------
    async def engine_stream(self, prompt: EnginePrompt, params: Any, request_id: str,
                            priority: int, lora_request: Any = None) -> AsyncGenerator[Any, None]:
        """One generation request; aborted if its consumer goes away before it finishes."""
        finished = False
        kwargs = {} if lora_request is None else {"lora_request": lora_request}
        request_id = unique_engine_id(request_id)
        stream = self.engine.generate(prompt.as_engine_input(), params, request_id,
                                      priority=priority, **kwargs)
        try:
            async for output in stream:
                finished = output.finished
                yield output
        finally:
            if not finished:
                self._abort_in_background(request_id, stream)

    def _abort_in_background(self, request_id: str, stream: Any) -> None:
        """Aborts from a fresh task: the caller may sit in a cancelled scope, where any await
        would be cancelled again. The task is referenced until it ends."""
        async def abort() -> None:
            try:
                await self.engine.abort(request_id)
            finally:
                await stream.aclose()

        try:
            task = asyncio.get_running_loop().create_task(abort())
        except RuntimeError:  # no running loop: the process is shutting down
            return
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)


def unique_engine_id(request_id: str) -> str:
    """The engine's id of a request: the client's id plus a random suffix (as vLLM's), so a
    reused `X-Request-Id` or body `request_id` never reaches another client's request."""
    return f"{request_id}-{secrets.token_hex(4)}"
