"""Prometheus metrics of one server, in its own `CollectorRegistry` (no global state).

Names follow vLLM's (`vllm:...`) so dashboards built for vLLM read ours. Counters and
histograms are fed by the serving layer as requests finish; the running/waiting gauges and
KV-cache usage are read from `engine.stats()` at scrape time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from workbench.engine.protocol import EngineClient

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                    60.0, 120.0, 240.0, 480.0)


class EngineStatsCollector:
    """Gauges read from the engine when Prometheus scrapes."""

    def __init__(self, engine: EngineClient, model_name: str):
        self.engine = engine
        self.model_name = model_name

    def collect(self):
        stats = self.engine.stats()
        for name, attr, doc in (
            ("vllm:num_requests_running", "num_running", "Requests in the running batch."),
            ("vllm:num_requests_waiting", "num_waiting", "Requests waiting to be scheduled."),
            ("vllm:kv_cache_usage_perc", "kv_cache_usage", "KV-cache usage, 1 = full."),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            gauge.add_metric([self.model_name], float(getattr(stats, attr, 0) or 0))
            yield gauge
        for name, attr, doc in (
            ("vllm:num_preemptions", "num_preemptions", "Sequences preempted (recomputed later)."),
            ("vllm:prefix_cache_queries", "prefix_cache_queries",
             "Prompt tokens looked up in the prefix cache."),
            ("vllm:prefix_cache_hits", "prefix_cache_hits", "Prompt tokens found in it."),
        ):
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            counter.add_metric([self.model_name], float(getattr(stats, attr, 0) or 0))
            yield counter


class ServingMetrics:
    """The serving layer's metrics for one model name, registered in `registry`."""

    def __init__(self, registry: CollectorRegistry, model_name: str, engine: EngineClient | None = None):
        self.registry = registry
        self.model_name = model_name
        labels = ["model_name"]
        self.requests = Counter("vllm:request_success", "Finished requests by finish reason.",
                                labels + ["finished_reason"], registry=registry)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefilled prompt tokens.", labels,
                                     registry=registry)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", labels,
                                         registry=registry)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                              labels, buckets=_TTFT_BUCKETS, registry=registry)
        self.latency = Histogram("vllm:e2e_request_latency_seconds", "End-to-end latency.",
                                 labels, buckets=_LATENCY_BUCKETS, registry=registry)
        if engine is not None:
            registry.register(EngineStatsCollector(engine, model_name))

    def first_token(self, seconds: float) -> None:
        self.ttft.labels(self.model_name).observe(seconds)

    def finished(self, seconds: float, prompt_tokens: int, generation_tokens: int,
                 finish_reasons: list[str | None]) -> None:
        self.latency.labels(self.model_name).observe(seconds)
        self.prompt_tokens.labels(self.model_name).inc(prompt_tokens)
        self.generation_tokens.labels(self.model_name).inc(generation_tokens)
        for reason in finish_reasons:
            self.requests.labels(self.model_name, reason or "unknown").inc()
