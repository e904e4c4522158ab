"""The serving pipeline every generation endpoint runs, as explicit stages.

    1. check model      `check_model`: unknown name -> 404 NotFoundError (param "model")
    2. validate request  `validate` (endpoint hook): refused fields, template trust, ...
    3. preprocess        `preprocess` (endpoint hook): render / tokenize, context-length rules;
                         then `sampling_params` per prompt (defaults chain, max-tokens rule)
    4. prepare generators one engine request per prompt, merged into one output stream
    5. collect           non-streaming: merge each choice's deltas (`collect`);
                         streaming: `prime` waits for the first output, then the endpoint
                         turns outputs into chunks
    6. build response    endpoint-specific (`completions.py`, `chat.py`)

Any stage ends the request by raising; `errors.error_response` turns the exception into the
error envelope. Every check, coercion and ignored field, the stage timings and the engine's
outputs go into the request's `PipelineRecorder` (`recorder.py`; `RequestMeta.recorder` to
pass your own), from which `workbench.inspect` builds `ValidationReport` and `Trace`;
`prepare(..., schedule=False)` is the dry run behind `validate`. Request ids come from `X-Request-Id` (else the body's `request_id`, else a
uuid); `X-data-parallel-rank` and `X-Vllm-Priority` are parsed from headers (invalid values
ignored); with `--otlp-traces-endpoint` each finished request is a span (`tracing.py`), a
child of the `traceparent` it came with; without it, trace headers get a one-time warning.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import NotFoundError
from workbench.sampling_params import BeamSearchParams, SamplingParams
from workbench.serving.config import ServerConfig
from workbench.serving.errors import GenerationError
from workbench.serving.metrics import ServingMetrics
from workbench.serving.offload import CpuPool
from workbench.serving.prompts import EnginePrompt, PromptTokenizer
from workbench.serving.protocol.common import PromptTokenUsageInfo
from workbench.serving.recorder import PipelineRecorder
from workbench.serving.request_logger import RequestLogger
from workbench.serving.sampling import server_defaults
from workbench.serving.streaming import ChoiceDelta, choice_deltas, merge_async_iterators
from workbench.version import __version__

logger = logging.getLogger("workbench.serving")
_TRACE_HEADERS = ("traceparent", "tracestate")


@dataclass(frozen=True)
class RequestMeta:
    """What the transport knows about a request besides its body (header names lower-case)."""

    headers: Mapping[str, str] = field(default_factory=dict)
    recorder: PipelineRecorder | None = field(default=None, compare=False)  # inspect hook

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def int_header(self, name: str) -> int | None:
        """An integer header; a missing or malformed one is ignored (None)."""
        try:
            return int(self.headers[name.lower()])
        except (KeyError, TypeError, ValueError):
            return None


@dataclass
class Generation:
    """One request between stage 4 and its response: prompts, params, the merged outputs."""

    request: Any
    request_id: str  # the response id, "cmpl-..." / "chatcmpl-..."
    model_name: str
    prompts: list[EnginePrompt]
    params: list[SamplingParams]
    outputs: AsyncIterator[tuple[int, Any]] | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    prompt_logprobs: dict[int, list | None] = field(default_factory=dict)
    recorder: PipelineRecorder = field(default_factory=PipelineRecorder)
    beam: list[BeamSearchParams] | None = None  # `use_beam_search`: one per prompt
    headers: Mapping[str, str] = field(default_factory=dict)  # trace context, for the span
    lora_request: Any = None  # the adapter it runs with (`workbench.lora`); None: base model

    @property
    def n(self) -> int:
        return self.beam[0].beam_width if self.beam else self.params[0].n

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p.token_ids) for p in self.prompts)


def fingerprint(engine: Any) -> str:
    """`workbench-<version>-<hash8>` of what shapes outputs (the model, dtype, context), like
    vLLM's `vllm-<version>-<hash8>`: equal fingerprints, same backend configuration."""
    import hashlib

    config = getattr(engine, "config", None)
    what = repr((getattr(engine, "model_path", None), getattr(config, "dtype", None),
                 engine.max_model_len, getattr(config, "seed", None)))
    return f"workbench-{__version__}-{hashlib.sha256(what.encode()).hexdigest()[:8]}"


class OpenAIServing:
    """What every endpoint needs: the engine, the served names, ids, headers, logging."""

    def __init__(self, engine: Any, config: ServerConfig | None = None,
                 metrics: ServingMetrics | None = None):
        self.engine = engine
        self.config = config or ServerConfig()
        self.served_model_names = self.config.served_model_names or (engine.served_model_name,)
        self.model_name = self.served_model_names[0]
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.prompts = PromptTokenizer(engine.tokenizer, engine.max_model_len, engine.vocab_size)
        self.defaults = server_defaults(getattr(engine, "generation_defaults", None))
        self.metrics = metrics
        self.request_logger = (RequestLogger(self.config.max_log_len)
                               if self.config.enable_log_requests else None)
        self._warned_trace = False
        self.system_fingerprint = fingerprint(engine)
        self.cpu = CpuPool()  # tokenizing and rendering off the loop; `Servings` shares one

    adapters = None  # `workbench.lora.serving.ServedAdapters`, shared by a server's endpoints
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


class GenerationServing(OpenAIServing):
    """Stages 1-5 for generating endpoints; subclasses supply the hooks and stage 6."""

    id_prefix = "cmpl"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._aborts: set[asyncio.Task] = set()

    def validate(self, request: Any) -> None:
        """Stage 2 hook: refuse what this endpoint cannot honour."""

    def preprocess(self, request: Any) -> list[EnginePrompt]:
        """Stage 3 hook: the prompts, tokenized and length-checked."""
        raise NotImplementedError

    def sampling_params(self, request: Any, prompt: EnginePrompt) -> SamplingParams:
        """Stage 3 hook: sampling parameters for one prompt."""
        raise NotImplementedError

    def add_prompt_tokens_details(self, usage: Any, gen: Generation) -> Any:
        """`--enable-prompt-tokens-details`: `usage.prompt_tokens_details.cached_tokens`, the
        prompt tokens read from the prefix cache (summed over the request's prompts)."""
        if self.config.enable_prompt_tokens_details:
            cached = sum(getattr(o, "num_cached_tokens", 0) or 0
                         for o in gen.recorder.outputs.values())
            usage.prompt_tokens_details = PromptTokenUsageInfo(cached_tokens=cached)
        return usage

    def engine_request_id(self, request_id: str, index: int) -> str:
        return f"{request_id}-{index}"

    def prepare(self, request: Any, meta: RequestMeta, *, schedule: bool = True) -> Generation:
        """Stages 1-4; raises to end the request with an error. Every check is recorded in
        `meta.recorder` (or a fresh one): `schedule=False` is the dry run of `validate`."""
        gen = self.build_generation(request, meta)
        if not schedule:
            self.check_engine_inputs(gen)
            return gen
        with gen.recorder.stage("prepare generators"):
            self.prepare_generators(gen, meta)                                         # 4
        return gen

    async def prepare_off_loop(self, request: Any, meta: RequestMeta) -> Generation:
        """`prepare` for a server: stages 1-3 (template, tokenizer: CPU-heavy) run in the
        server's thread pool, so the event loop stays free; stage 4 on the loop."""
        gen = await self.cpu.run(self.build_generation, request, meta)
        with gen.recorder.stage("prepare generators"):
            self.prepare_generators(gen, meta)                                         # 4
        return gen

    def build_generation(self, request: Any, meta: RequestMeta) -> Generation:
        """Stages 1-3: the checked request as a `Generation`, nothing queued yet."""
        rec = meta.recorder if meta.recorder is not None else PipelineRecorder()
        with rec.stage("check model"), rec.check("model", "check model", "model"):     # 1
            self.check_model(request.model)
        with rec.check("headers", "check model"):
            self.check_headers(meta)
        with rec.stage("validate"), rec.check("supported fields", "validate"):          # 2
            self.validate(request)
        rec.fields(request)
        with rec.stage("preprocess"), rec.check(self.preprocess_check, "preprocess"):   # 3
            prompts = self.preprocess(request)
        for prompt in prompts:  # keys the request's prefix-cache blocks apart from others'
            prompt.cache_salt = getattr(request, "cache_salt", None)
        with rec.stage("sampling params"), rec.check("sampling parameters", "sampling params"):
            params = [self.sampling_params(request, prompt) for prompt in prompts]
            for p in params:
                p.verify(self.engine.vocab_size, self.engine.config.max_logprobs)
        self.record_coercions(rec, request, prompts, params)
        body_id = getattr(request, "request_id", None)
        gen = Generation(request=request, model_name=self.model_name, prompts=prompts,
                         params=params, recorder=rec, headers=meta.headers,
                         request_id=f"{self.id_prefix}-{self.base_request_id(meta, body_id)}")
        if getattr(request, "use_beam_search", False):
            gen.beam = [beam_search_params(request, p) for p in params]
        gen.lora_request = self.lora_request_for(request)
        if gen.lora_request is not None:  # responses name the adapter, as vLLM's
            gen.model_name = gen.lora_request.lora_name
        return gen

    preprocess_check = "prompt (chat template, tokenize, input length)"

    def record_coercions(self, rec: PipelineRecorder, request: Any,
                         prompts: list[EnginePrompt], params: list[SamplingParams]) -> None:
        mct = getattr(request, "max_completion_tokens", None)
        name, requested = (("max_completion_tokens", mct) if mct is not None
                           else ("max_tokens", request.max_tokens))
        seen = len(rec.checks)
        for prompt, p in zip(prompts, params):
            rec.coercions(request, p, self.defaults, name, requested, len(prompt.token_ids),
                          self.max_model_len)
        unique = list(dict.fromkeys(rec.checks[seen:]))  # one row per distinct coercion
        rec.checks[seen:] = unique

    def check_engine_inputs(self, gen: Generation) -> None:
        """Dry run of stage 4: the engine's own input checks, without queueing anything."""
        core = getattr(self.engine, "engine", self.engine)
        inputs = getattr(core, "inputs", None)
        if inputs is None:
            return
        with gen.recorder.stage("engine inputs"), gen.recorder.check("engine inputs", "schedule"):
            for i, (prompt, params) in enumerate(zip(gen.prompts, gen.params)):
                inputs.process(self.engine_request_id(gen.request_id, i),
                               prompt.as_engine_input(), params)

    def prepare_generators(self, gen: Generation, meta: RequestMeta) -> None:
        """Stage 4: one engine request per prompt, merged; nothing runs until iterated."""
        priority = meta.int_header("x-vllm-priority")
        priority = gen.request.priority if priority is None else priority
        streams = []
        for i, (prompt, params) in enumerate(zip(gen.prompts, gen.params)):
            engine_id = self.engine_request_id(gen.request_id, i)
            if self.request_logger is not None:
                self.request_logger.log_inputs(engine_id, prompt.text, prompt.token_ids, params)
            if gen.beam is not None:
                streams.append(self._beam_stream(prompt, gen.beam[i], engine_id, priority,
                                                 gen.lora_request))
            else:
                streams.append(self._engine_stream(prompt, params, engine_id, priority,
                                                   gen.lora_request))
        gen.outputs = self._timed(gen, merge_async_iterators(*streams))

    async def _engine_stream(self, prompt: EnginePrompt, params: SamplingParams,
                             request_id: str, priority: int,
                             lora_request: Any = None) -> AsyncIterator[Any]:
        """One engine request; aborted if its consumer goes away before it finishes."""
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

    async def _beam_stream(self, prompt: EnginePrompt, params: BeamSearchParams,
                           request_id: str, priority: int,
                           lora_request: Any = None) -> AsyncIterator[Any]:
        """One beam search in the engine: its final result as one `RequestOutput`."""
        finished = False
        request_id = unique_engine_id(request_id)
        stream = self.engine.beam_search(prompt.as_engine_input(), request_id, params,
                                         priority=priority, lora_request=lora_request)
        try:
            async for output in stream:
                finished = True
                yield output.to_request_output()
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

    async def _timed(self, gen: Generation, outputs: AsyncIterator[tuple[int, Any]]):
        async with aclosing(outputs):
            async for index, output in outputs:
                gen.recorder.output(index, output)
                if gen.first_token_at is None and any(o.token_ids for o in output.outputs):
                    gen.first_token_at = time.perf_counter()
                    if self.metrics is not None:
                        self.metrics.first_token(gen.first_token_at - gen.started)
                if output.prompt_logprobs is not None and index not in gen.prompt_logprobs:
                    gen.prompt_logprobs[index] = list(output.prompt_logprobs)
                yield index, output

    async def stream_deltas(self, gen: Generation) -> AsyncIterator[ChoiceDelta]:
        """Stage 5: every choice's deltas as the engine produces them; an engine error raises."""
        async with aclosing(gen.outputs) as outputs:
            async for index, output in outputs:
                for delta in choice_deltas(output, index, gen.n):
                    if delta.finish_reason == "error":  # vLLM's log line and message
                        logger.error("Request %s failed with an internal error during "
                                     "generation", output.request_id)
                        raise GenerationError("Internal server error")
                    yield delta

    async def collect(self, gen: Generation) -> list[ChoiceDelta]:
        """Stage 5 (non-streaming): every choice's deltas merged, in choice order."""
        merged = {i: ChoiceDelta(index=i) for i in range(len(gen.prompts) * gen.n)}
        async with aclosing(self.stream_deltas(gen)) as deltas:
            async for delta in deltas:
                merged[delta.index].extend(delta)
        choices = list(merged.values())
        self.finished(gen, choices)
        return choices

    async def prime(self, gen: Generation) -> None:
        """Stage 5 (streaming): wait for the first output so engine refusals are still 4xx."""
        outputs = gen.outputs
        try:
            first = await anext(outputs)
        except StopAsyncIteration:
            first = None
        except BaseException:
            await outputs.aclose()
            raise

        async def chained():
            async with aclosing(outputs):
                if first is not None:
                    yield first
                    async for item in outputs:
                        yield item

        gen.outputs = chained()

    def finished(self, gen: Generation, choices: list[ChoiceDelta]) -> None:
        """Metrics and the request log, once per request."""
        gen.recorder.finished_at = time.time()
        if self.metrics is not None:
            self.metrics.finished(time.perf_counter() - gen.started, gen.num_prompt_tokens,
                                  sum(len(c.token_ids) for c in choices),
                                  [c.finish_reason for c in choices])
        if self.request_logger is not None:
            self.request_logger.log_outputs(gen.request_id, [c.text for c in choices],
                                            [c.finish_reason for c in choices])
        if self.tracer is not None:
            self.tracer.record(gen, choices, gen.headers)


def unique_engine_id(request_id: str) -> str:
    """The engine's id of a request: the client's id plus a random suffix (as vLLM's), so a
    reused `X-Request-Id` or body `request_id` never reaches another client's request."""
    return f"{request_id}-{secrets.token_hex(4)}"


def beam_search_params(request: Any, params: SamplingParams) -> BeamSearchParams:
    """`use_beam_search`: width `n`, the resolved max_tokens and temperature (as vLLM's
    `to_beam_search_params`); stop strings, penalties and sampling knobs do not apply."""
    return BeamSearchParams(
        beam_width=request.n if request.n is not None else 1, max_tokens=params.max_tokens, ignore_eos=params.ignore_eos,
        temperature=params.temperature, length_penalty=request.length_penalty,
        include_stop_str_in_output=params.include_stop_str_in_output,
        skip_special_tokens=params.skip_special_tokens)
