"""OpenTelemetry spans (`--otlp-traces-endpoint`): one per request, stages as events,
checked with the SDK's in-memory exporter."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind  # noqa: E402

from workbench.serving import RequestMeta, ServerConfig, Servings  # noqa: E402
from workbench.serving.protocol import ChatCompletionRequest, CompletionRequest  # noqa: E402
from workbench.serving.tracing import RequestTracer  # noqa: E402

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def traced(fake_engine):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    servings = Servings.build(fake_engine, ServerConfig())
    servings.use_tracer(RequestTracer(provider))
    return servings, exporter


async def test_each_request_is_one_span_with_the_pipeline_stages_as_events(traced):
    servings, exporter = traced
    await servings.chat.create(ChatCompletionRequest(
        messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0.5),
        RequestMeta({"x-request-id": "abc"}))
    await servings.completions.create(CompletionRequest(prompt="Hi", max_tokens=2), RequestMeta())
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["llm_request", "llm_request"]
    chat = spans[0]
    assert chat.kind == SpanKind.SERVER
    assert chat.attributes["gen_ai.request.id"] == "chatcmpl-abc"
    assert chat.attributes["gen_ai.request.temperature"] == 0.5
    assert chat.attributes["gen_ai.usage.completion_tokens"] == 3
    assert chat.attributes["gen_ai.usage.prompt_tokens"] > 0
    events = [e.name for e in chat.events]
    assert events[:5] == ["check model", "validate", "preprocess", "sampling params",
                          "prepare generators"]
    assert events[-2:] == ["first token", "finished"]
    assert chat.start_time <= chat.events[0].timestamp <= chat.end_time


async def test_a_traceparent_header_makes_the_span_its_child(traced):
    servings, exporter = traced
    await servings.completions.create(CompletionRequest(prompt="Hi", max_tokens=1),
                                      RequestMeta({"traceparent": PARENT}))
    span = exporter.get_finished_spans()[0]
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == "00f067aa0ba902b7"


def test_the_endpoint_flag_builds_an_otlp_tracer(fake_engine):
    config = ServerConfig(otlp_traces_endpoint="http://127.0.0.1:4317")
    servings = Servings.build(fake_engine, config)
    try:
        assert servings.chat.tracer is servings.completions.tracer is not None
    finally:
        servings.close()


def test_the_flag_reaches_the_server_config():
    from workbench.apps.cli import build_parser, configs_from_args

    args = build_parser().parse_args(["serve", "--otlp-traces-endpoint", "http://collector:4317"])
    _, server = configs_from_args(args)
    assert server.otlp_traces_endpoint == "http://collector:4317"


async def test_a_response_is_one_span_with_its_rounds_as_events(traced):
    from workbench.serving.protocol.responses import ResponsesRequest

    servings, exporter = traced
    response = await servings.responses.create(
        ResponsesRequest(input="Hi", max_output_tokens=3), RequestMeta({"traceparent": PARENT}))
    span = exporter.get_finished_spans()[0]
    assert span.attributes["gen_ai.request.id"] == response.id
    assert span.attributes["gen_ai.usage.completion_tokens"] == response.usage.output_tokens
    assert [e.name for e in span.events] == ["round 0", "finished"]
    assert format(span.context.trace_id, "032x") == TRACE_ID


POOLING_EVENTS = ["check model", "validate", "preprocess", "pooling params", "prepare generators",
                  "collect batch", "build response", "finished"]


@pytest.fixture
def traced_pooling(tokenizer):
    from tests.serving.test_pooling_pipeline import FakePoolingEngine

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine = FakePoolingEngine(tokenizer, max_model_len=4096, is_pooling_model=False,
                               pooling_tasks=("classify", "score", "embed", "encode"))
    servings = Servings.build(engine, ServerConfig())
    servings.use_tracer(RequestTracer(provider))
    return servings, exporter


async def test_each_pooling_request_is_one_span_with_the_pipeline_stages_as_events(
        traced_pooling):
    from workbench.serving.protocol.pooling import (
        ClassificationCompletionRequest,
        EmbeddingCompletionRequest,
        PoolingCompletionRequest,
        RerankRequest,
        ScoreRequest,
    )

    servings, exporter = traced_pooling
    calls = [(servings.embeddings, EmbeddingCompletionRequest(input=["a", "b"]), "embed"),
             (servings.classify, ClassificationCompletionRequest(input="a"), "classify"),
             (servings.score, ScoreRequest(queries="a", documents=["b", "c"]), "score"),
             (servings.rerank, RerankRequest(query="a", documents=["b"]), "score"),
             (servings.pooling, PoolingCompletionRequest(input=[3, 4]), "classify")]
    responses = [await serving.create(request, RequestMeta({"traceparent": PARENT}))
                 for serving, request, _ in calls]
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["llm_request"] * len(calls)
    for span, response, (_, _request, task) in zip(spans, responses, calls):
        assert span.kind == SpanKind.SERVER
        assert [e.name for e in span.events] == POOLING_EVENTS
        assert span.attributes["gen_ai.request.id"] == response.id
        assert span.attributes["gen_ai.response.model"] == response.model
        assert span.attributes["gen_ai.usage.prompt_tokens"] == response.usage.prompt_tokens
        assert span.attributes["gen_ai.usage.completion_tokens"] == 0
        assert span.attributes["workbench.pooling.task"] == task
        assert "gen_ai.request.temperature" not in span.attributes
        assert format(span.context.trace_id, "032x") == TRACE_ID
        assert span.start_time <= span.events[0].timestamp <= span.end_time


async def test_a_failed_pooling_request_makes_no_span(traced_pooling):
    from workbench.serving.protocol.pooling import EmbeddingCompletionRequest

    servings, exporter = traced_pooling
    with pytest.raises(Exception, match="does not exist"):
        await servings.embeddings.create(EmbeddingCompletionRequest(input="a", model="nope"),
                                         RequestMeta())
    assert exporter.get_finished_spans() == ()
