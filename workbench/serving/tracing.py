"""OpenTelemetry spans of requests, as vLLM's `--otlp-traces-endpoint`.

With tracing on, every finished request (chat, completions, responses, and the pooling
endpoints: embeddings, classify, score, rerank, pooling) becomes one span, `llm_request` (kind SERVER), a child of the caller's span when the request carries W3C
`traceparent` / `tracestate` headers. Its attributes are vLLM's `gen_ai.*` names (request id,
model, sampling knobs, token counts, latencies); its events are the pipeline's stages as the
`PipelineRecorder` timed them (check model, validate, preprocess, sampling / pooling params,
prepare generators; pooling adds collect batch and build response), then `first token` (a
generation) and `finished` (a response: one event per round of its tool loop). OpenTelemetry is an optional dependency:
`pip install workbench[tracing]` (`opentelemetry-sdk`, `opentelemetry-exporter-otlp-proto-grpc`).
A span that fails to record is logged, never the request's failure.

>>> from opentelemetry.sdk.trace import TracerProvider
>>> RequestTracer(TracerProvider()).tracer is not None
True
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from workbench.sampling_params import SamplingParams

logger = logging.getLogger("workbench.serving")
SPAN_NAME = "llm_request"
MISSING = ("OpenTelemetry is not installed: --otlp-traces-endpoint needs opentelemetry-sdk and "
           "opentelemetry-exporter-otlp-proto-grpc (pip install 'workbench[tracing]').")


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def generates(ctx: Any) -> bool:
    """A generation request (its parameters are `SamplingParams`), not a pooling one."""
    return isinstance(ctx.params[0], SamplingParams)


class RequestTracer:
    """Makes one span per finished request on a `TracerProvider` (yours, or `from_endpoint`'s)."""

    def __init__(self, provider: Any):
        self.provider = provider
        self.tracer = provider.get_tracer("workbench.serving")

    @classmethod
    def from_endpoint(cls, endpoint: str) -> "RequestTracer":
        """Spans exported in batches over OTLP (gRPC) to `endpoint`, e.g. http://127.0.0.1:4317."""
        try:  # deferred: opentelemetry is an optional extra (--otlp-traces-endpoint only)
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise ValueError(MISSING) from exc
        provider = TracerProvider(resource=Resource.create({"service.name": "workbench"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        return cls(provider)

    def record(self, ctx: Any, choices: list[Any]) -> None:
        """The span of one finished request (a `ServeContext`; its choices as `ChoiceDelta`s),
        from its recorder's timings, a child of the trace context in its headers."""
        try:
            self._record(ctx, choices)
        except Exception:  # noqa: BLE001 - tracing never fails a request
            logger.warning("could not record the span of %s", ctx.request_id, exc_info=True)

    def _record(self, ctx: Any, choices: list[Any]) -> None:
        # deferred: opentelemetry is an optional extra; a tracer exists only when it is there
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        rec = ctx.recorder
        start = rec.stages[0][1] if rec.stages else rec.finished_at
        span = self.tracer.start_span(SPAN_NAME, context=extract(dict(ctx.headers)),
                                      kind=SpanKind.SERVER, start_time=_ns(start))
        span.set_attributes(self.attributes(ctx, choices, start))
        for name, began, ended in rec.stages:
            span.add_event(name, {"duration_s": ended - began}, timestamp=_ns(began))
        if rec.first_output_at is not None and generates(ctx):
            span.add_event("first token", timestamp=_ns(rec.first_output_at))
        span.add_event("finished", {"finish_reasons": [str(c.finish_reason) for c in choices]},
                       timestamp=_ns(rec.finished_at))
        span.end(end_time=_ns(rec.finished_at))

    def record_response(self, response: Any, loop: Any, elapsed: float,
                        headers: Mapping[str, str]) -> None:
        """The span of one finished `/v1/responses` request: its rounds as events."""
        try:
            self._record_response(response, loop, elapsed, headers)
        except Exception:  # noqa: BLE001 - tracing never fails a request
            logger.warning("could not record the span of %s", response.id, exc_info=True)

    def _record_response(self, response: Any, loop: Any, elapsed: float,
                         headers: Mapping[str, str]) -> None:
        # deferred: opentelemetry is an optional extra; a tracer exists only when it is there
        from opentelemetry.propagate import extract
        from opentelemetry.trace import SpanKind

        end = time.time()
        span = self.tracer.start_span(SPAN_NAME, context=extract(dict(headers)),
                                      kind=SpanKind.SERVER, start_time=_ns(end - elapsed))
        span.set_attributes({
            "gen_ai.request.id": response.id, "gen_ai.response.model": response.model,
            "gen_ai.usage.prompt_tokens": response.usage.input_tokens,
            "gen_ai.usage.completion_tokens": response.usage.output_tokens,
            "gen_ai.latency.e2e": elapsed})
        for r in loop.rounds:  # recorded when the response ends: no per-round timestamps
            span.add_event(f"round {r.index}", {
                "request_id": r.request_id, "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens, "finish_reason": str(r.finish_reason)},
                timestamp=_ns(end))
        span.add_event("finished", {"status": str(response.status)}, timestamp=_ns(end))
        span.end(end_time=_ns(end))

    @staticmethod
    def attributes(ctx: Any, choices: list[Any], start: float) -> dict[str, Any]:
        """vLLM's span attributes (`vllm.tracing.SpanAttributes`) that this server knows; a
        pooling request's have no sampling knobs, and its task instead."""
        params = ctx.params[0]
        rec = ctx.recorder
        attributes = {
            "gen_ai.request.id": ctx.request_id,
            "gen_ai.response.model": ctx.model_name,
            "gen_ai.usage.num_sequences": len(choices),
            "gen_ai.usage.prompt_tokens": ctx.num_prompt_tokens,
            "gen_ai.usage.completion_tokens": sum(len(c.token_ids) for c in choices),
            "gen_ai.latency.e2e": rec.finished_at - start,
        }
        if generates(ctx):
            attributes.update({"gen_ai.request.temperature": params.temperature,
                               "gen_ai.request.top_p": params.top_p,
                               "gen_ai.request.max_tokens": params.max_tokens,
                               "gen_ai.request.n": params.n})
        else:  # PoolingParams
            attributes["workbench.pooling.task"] = str(params.task)
        if rec.first_output_at is not None and generates(ctx):
            attributes["gen_ai.latency.time_to_first_token"] = rec.first_output_at - start
        return attributes

    def shutdown(self) -> None:
        """Flushes and stops the exporter (the server is stopping)."""
        shutdown = getattr(self.provider, "shutdown", None)
        if shutdown is not None:
            shutdown()
