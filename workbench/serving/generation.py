"""Generation endpoints (completions, chat) on the one pipeline (`base.OpenAIServing`).

`GenerationServing` implements the pipeline's hooks that every generating endpoint shares:
sampling parameters per prompt (`sampling_params`, the endpoint's hook; the defaults chain
and the max-tokens rule), the engine's input checks as the dry run, one engine request per
prompt merged into one output stream (`use_beam_search`: one beam search per prompt), and
the outputs as `ChoiceDelta`s: merged per choice (`collect`), or streamed after `prime` waited
for the first output so engine refusals are still 4xx. Endpoints add `validate`,
`preprocess`, `sampling_params` and `build_response` (`completions.py`, `chat.py`).
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from workbench.sampling_params import BeamSearchParams, SamplingParams
from workbench.serving.base import OpenAIServing, RequestMeta, unique_engine_id
from workbench.serving.context import ServeContext
from workbench.serving.errors import GenerationError
from workbench.serving.prompts import EnginePrompt
from workbench.serving.protocol.common import PromptTokenUsageInfo
from workbench.serving.recorder import engine_first_token_time
from workbench.serving.streaming import (
    ChoiceDelta,
    choice_deltas,
    hold_back,
    merge_async_iterators,
)

logger = logging.getLogger("workbench.serving")


class GenerationServing(OpenAIServing):
    """The generation side of the pipeline; endpoints supply the request-specific hooks."""

    @abc.abstractmethod
    def sampling_params(self, request: Any, prompt: EnginePrompt) -> SamplingParams:
        """Sampling parameters for one prompt."""

    def build_context(self, request: Any, meta: RequestMeta | None = None) -> ServeContext:
        """Stages 1-3, then the coercions the parameters made and `use_beam_search`."""
        ctx = super().build_context(request, meta)
        self.record_coercions(ctx)
        if getattr(request, "use_beam_search", False):
            ctx.beam = [beam_search_params(request, p) for p in ctx.require_params()]
        ctx.started, ctx.created = time.perf_counter(), int(time.time())  # latency from here
        return ctx

    def build_params(self, ctx: ServeContext) -> list[SamplingParams]:
        prompts = ctx.require_prompts()
        for prompt in prompts:  # keys the request's prefix-cache blocks apart
            prompt.cache_salt = getattr(ctx.request, "cache_salt", None)
        params = [self.sampling_params(ctx.request, prompt) for prompt in prompts]
        for p in params:
            p.verify(self.engine.vocab_size, self.engine.config.max_logprobs)
        self.resolve_inside(ctx, prompts, params)
        if params and params[0].token_stats:  # one row: every prompt's params ask alike
            ctx.recorder.add(*token_stats_check(params[0]))
        return params

    def resolve_inside(self, ctx: ServeContext, prompts: list[EnginePrompt],
                       params: list[SamplingParams]) -> None:
        """A capture, logit lens or interventions resolved against the model here, once per
        prompt (`SamplingParams.resolve_inside`: the engine reuses it), so a bad site or layer,
        a capture over --max-capture-mb or a wrong-size vector is a 400 before anything is
        queued; recorded as resolved: the names captured, the lens, each intervention's site."""
        shape = getattr(self.engine, "model_shape", None)  # none: the engine resolves alone
        seen: set[str] = set()
        for prompt, p in zip(prompts, params):
            if shape is None or not p.wants_inside:
                continue
            assert p.max_tokens is not None  # resolved by the sampling_params hook
            inside = p.resolve_inside(shape, len(prompt.token_ids) + p.max_tokens)
            for row in inside_checks(inside):
                key = repr(row)
                if key not in seen:  # one row per distinct resolution (several prompts)
                    seen.add(key)
                    ctx.recorder.add(*row)

    def record_coercions(self, ctx: ServeContext) -> None:
        rec, request = ctx.recorder, ctx.request
        mct = getattr(request, "max_completion_tokens", None)
        name, requested = (("max_completion_tokens", mct) if mct is not None
                           else ("max_tokens", request.max_tokens))
        seen = len(rec.checks)
        for prompt, p in zip(ctx.require_prompts(), ctx.require_params()):
            rec.coercions(request, p, self.defaults, name, requested, len(prompt.token_ids),
                          self.max_model_len)
        unique = list(dict.fromkeys(rec.checks[seen:]))  # one row per distinct coercion
        rec.checks[seen:] = unique

    def add_prompt_tokens_details(self, usage: Any, ctx: ServeContext) -> Any:
        """`--enable-prompt-tokens-details`: `usage.prompt_tokens_details.cached_tokens`, the
        prompt tokens read from the prefix cache (summed over the request's prompts)."""
        if self.config.enable_prompt_tokens_details:
            cached = sum(getattr(o, "num_cached_tokens", 0) or 0
                         for o in ctx.recorder.outputs.values())
            usage.prompt_tokens_details = PromptTokenUsageInfo(cached_tokens=cached)
        return usage

    def dry_run(self, ctx: ServeContext) -> None:
        """The engine's own input checks of every prompt, without queueing anything."""
        with ctx.recorder.stage("engine inputs"), ctx.recorder.check("engine inputs", "schedule"):
            for i, (prompt, params) in enumerate(zip(ctx.require_prompts(),
                                                     ctx.require_params())):
                self.engine.check_inputs(self.engine_request_id(ctx, i),
                                         prompt.as_engine_input(), params)

    def prepare_generators(self, ctx: ServeContext) -> None:
        """One engine request per prompt, merged; nothing runs until iterated."""
        priority = ctx.meta.int_header("x-vllm-priority")
        priority = ctx.request.priority if priority is None else priority
        streams = []
        for i, (prompt, params) in enumerate(zip(ctx.require_prompts(), ctx.require_params())):
            engine_id = self.engine_request_id(ctx, i)
            if self.request_logger is not None:
                self.request_logger.log_inputs(engine_id, prompt.text, prompt.token_ids, params)
            if ctx.beam is not None:
                streams.append(self._beam_stream(prompt, ctx.beam[i], engine_id, priority,
                                                 ctx.lora_request))
            else:
                streams.append(self.engine_stream(prompt, params, engine_id, priority,
                                                  ctx.lora_request))
        ctx.result_generator = self._timed(ctx, merge_async_iterators(*streams))

    async def _beam_stream(self, prompt: EnginePrompt, params: BeamSearchParams,
                           request_id: str, priority: int,
                           lora_request: Any = None) -> AsyncGenerator[Any, None]:
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

    async def _timed(self, ctx: ServeContext, outputs: AsyncGenerator[tuple[int, Any], None]
                     ) -> AsyncGenerator[tuple[int, Any], None]:
        async with aclosing(outputs):
            async for index, output in outputs:
                ctx.recorder.output(index, output)
                if ctx.first_token_at is None and any(o.token_ids for o in output.outputs):
                    ctx.first_token_at = time.perf_counter() - since_first_token(output)
                    if self.metrics is not None:
                        self.metrics.first_token(ctx.first_token_at - ctx.started)
                if output.prompt_logprobs is not None and index not in ctx.prompt_logprobs:
                    ctx.prompt_logprobs[index] = list(output.prompt_logprobs)
                    stats = getattr(output, "prompt_token_stats", None)
                    if stats is not None:
                        ctx.prompt_token_stats[index] = list(stats)
                yield index, output

    async def stream_deltas(self, ctx: ServeContext) -> AsyncGenerator[ChoiceDelta, None]:
        """Stage 5: every choice's deltas as the engine produces them; an engine error raises."""
        async with aclosing(ctx.require_generator()) as outputs:
            async for index, output in outputs:
                for delta in choice_deltas(output, index, ctx.n):
                    if delta.finish_reason == "error":  # vLLM's log line and message
                        logger.error("Request %s failed with an internal error during "
                                     "generation", output.request_id)
                        raise GenerationError("Internal server error")
                    yield delta

    def streamed_deltas(self, ctx: ServeContext) -> AsyncGenerator[ChoiceDelta, None]:
        """`stream_deltas` as a stream sends them: with `stream_options.min_characters`, each
        choice's text held back until it has that many characters (`streaming.hold_back`)."""
        least = getattr(ctx.request.stream_options, "min_characters", None)
        deltas = self.stream_deltas(ctx)
        return deltas if least is None else hold_back(deltas, least)

    async def collect(self, ctx: ServeContext) -> None:
        """Stage 5 (non-streaming): every choice's deltas merged, in choice order, as
        `ctx.final_res_batch`."""
        merged = {i: ChoiceDelta(index=i) for i in range(len(ctx.require_prompts()) * ctx.n)}
        async with aclosing(self.stream_deltas(ctx)) as deltas:
            async for delta in deltas:
                merged[delta.index].extend(delta)
        ctx.final_res_batch = list(merged.values())

    async def prime(self, ctx: ServeContext) -> None:
        """Stage 5 (streaming): wait for the first output so engine refusals are still 4xx."""
        outputs = ctx.require_generator()
        try:
            first = await anext(outputs)
        except StopAsyncIteration:
            first = None
        except BaseException:
            await outputs.aclose()
            raise

        async def chained() -> AsyncGenerator[tuple[int, Any], None]:
            async with aclosing(outputs):
                if first is not None:
                    yield first
                    async for item in outputs:
                        yield item

        ctx.result_generator = chained()

    def finished(self, ctx: ServeContext, response: Any) -> None:
        """Metrics, the request log and the span of `ctx.final_res_batch`, the choices."""
        choices = ctx.require_results()
        ctx.recorder.finished_at = time.time()
        if self.metrics is not None:
            self.metrics.finished(time.perf_counter() - ctx.started, ctx.num_prompt_tokens,
                                  sum(len(c.token_ids) for c in choices),
                                  [c.finish_reason for c in choices])
        if self.request_logger is not None:
            self.request_logger.log_outputs(ctx.request_id, [c.text for c in choices],
                                            [c.finish_reason for c in choices])
        if self.tracer is not None:
            self.tracer.record(ctx, choices)


def inside_checks(inside: Any) -> list[tuple[str, str, str, str, str, Any]]:
    """The report's rows of what a request sees and changes inside the model (its resolved
    `Inside`), as `PipelineRecorder.add` arguments: (name, stage, status, param, reason,
    value)."""
    rows = []
    stage = "sampling params"
    if inside.capture is not None:
        c = inside.capture.to_json()
        how = f", reduced by {c['reduce']}" if c["reduce"] else ""
        heads = f", heads {c['heads']}" if c["heads"] else ""
        rows.append(("capture", stage, "passed", "capture",
                     f"records {', '.join(c['sites'])} at positions {c['positions']}"
                     f"{how}{heads}", c))
    if inside.logit_lens is not None:
        lens = inside.logit_lens.to_json()
        ids = f", and the ranks of token ids {lens['token_ids']}" if lens["token_ids"] else ""
        layers = "every layer" if lens["layers"] is None else f"layers {lens['layers']}"
        rows.append(("logit_lens", stage, "passed", "logit_lens",
                     f"top {lens['top_k']} tokens after {layers} at positions "
                     f"{lens['positions']}{ids}", lens))
    if inside.features is not None:
        f = inside.features.to_json()
        named = f", features {f['indices']}" if f["indices"] else ""
        rows.append(("features", stage, "passed", "features",
                     f"SAE {f['sae']!r} at {f['hook_name']}: top {f['top_k']} features"
                     f"{named} at positions {f['positions']}", f))
    for i, intervention in enumerate(inside.interventions):
        v = intervention.to_json()
        what = f" {v['name']!r}" if "name" in v else \
            f" feature {v['feature']['index']} of {v['feature']['sae']!r}" if "feature" in v else ""
        scale = f" x{v['scale']}" if "scale" in v and v["scale"] != 1.0 else ""
        heads = f", heads {v['heads']}" if "heads" in v else ""
        rows.append((f"interventions[{i}]", stage, "passed", f"interventions[{i}]",
                     f"{v['op']}{what}{scale} at {v['site']}, positions {v['positions']}"
                     f"{heads}", v))
    return rows


def token_stats_check(params: SamplingParams) -> tuple[str, str, str, str, str, Any]:
    """The report's row of `token_stats`, as `PipelineRecorder.add` arguments: where the
    numbers come (generated positions with logprobs, prompt positions with prompt_logprobs)."""
    where = [what for what, asked in (("each generated position", params.wants_logprobs),
                                      ("each prompt position", params.prompt_logprobs is not None))
             if asked]
    return ("token_stats", "sampling params", "passed", "token_stats",
            "entropy of the whole vocabulary's distribution, the token's rank, the top-2 margin "
            f"and the top-k mass at {' and '.join(where)}, from the full logits", True)


def beam_search_params(request: Any, params: SamplingParams) -> BeamSearchParams:
    """`use_beam_search`: width `n`, the resolved max_tokens and temperature (as vLLM's
    `to_beam_search_params`); stop strings, penalties and sampling knobs do not apply."""
    assert params.max_tokens is not None, "every sampling_params hook resolves max_tokens"
    return BeamSearchParams(
        beam_width=request.n if request.n is not None else 1, max_tokens=params.max_tokens,
        ignore_eos=params.ignore_eos,
        temperature=params.temperature, length_penalty=request.length_penalty,
        include_stop_str_in_output=params.include_stop_str_in_output,
        skip_special_tokens=params.skip_special_tokens)


def since_first_token(output: Any) -> float:
    """Seconds since the engine produced `output`'s first token (0 if it does not say): a
    non-streaming request's one output arrives when it finishes, not at its first token."""
    first = engine_first_token_time(output)
    return 0.0 if first is None else max(0.0, time.time() - first)
