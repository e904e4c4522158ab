"""OpenAI-compatible semantics, free of any transport.

Each endpoint family has a serving object (`CompletionServing`, `ChatServing`,
`TokenizeServing`, `ModelsServing`) that takes a parsed request model (`protocol`) and a
`RequestMeta` (headers) and returns a response model or an async iterator of JSON chunks;
failures raise, and `errors.error_response` maps them to the OpenAI error envelope.
`workbench.http` puts them behind FastAPI; a notebook can call them directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.engine.protocol import EngineClient
from workbench.serving.base import EngineServing, RequestMeta
from workbench.serving.chat import ChatServing
from workbench.serving.compare import CompareServing
from workbench.serving.completions import CompletionServing
from workbench.serving.config import ServerConfig
from workbench.serving.errors import ServingError, error_response
from workbench.serving.lora import ServedAdapters
from workbench.serving.metrics import ServingMetrics
from workbench.serving.models import ModelsServing
from workbench.serving.neuronpedia import NeuronpediaServing
from workbench.serving.offload import CpuPool
from workbench.serving.pooling import (
    ClassifyServing,
    EmbeddingServing,
    PoolingEndpointServing,
    RerankServing,
    ScoreServing,
)
from workbench.serving.responses import ResponsesServing
from workbench.serving.tokenize import TokenizeServing
from workbench.serving.tracing import RequestTracer


@dataclass
class Servings:
    """The serving objects of one server, sharing one engine and one configuration."""

    completions: CompletionServing
    chat: ChatServing
    tokenize: TokenizeServing
    models: ModelsServing
    embeddings: EmbeddingServing | None = None  # pooling endpoints (`serving/pooling/`)
    pooling: PoolingEndpointServing | None = None
    classify: ClassifyServing | None = None
    score: ScoreServing | None = None
    rerank: RerankServing | None = None
    responses: ResponsesServing | None = None  # `/v1/responses` (`serving/responses/`)
    compare: CompareServing | None = None  # `/v1/compare`, ours (`serving/compare.py`)
    neuronpedia: NeuronpediaServing | None = None  # Neuronpedia's routes (`neuronpedia.py`)

    def __post_init__(self) -> None:
        """One `ServedAdapters` (LoRA adapter names) shared by every endpoint; a server's
        static adapters load here, so a bad one stops the start."""
        self.adapters = ServedAdapters.from_config(self.completions.engine,
                                                   self.completions.config)
        self.cpu = CpuPool()  # one preprocessing pool per server (`offload.py`)
        endpoint = self.completions.config.otlp_traces_endpoint
        self.tracer = RequestTracer.from_endpoint(endpoint) if endpoint else None
        for serving in self.endpoints():
            serving.adapters = self.adapters
            serving.cpu = self.cpu
            serving.tracer = self.tracer

    def endpoints(self) -> list[Any]:
        return [s for s in vars(self).values() if isinstance(s, EngineServing)]

    def use_tracer(self, tracer: RequestTracer | None) -> None:
        """Spans of every endpoint go to `tracer` (e.g. one on an in-memory exporter)."""
        self.tracer = tracer
        for serving in self.endpoints():
            serving.tracer = tracer

    def close(self) -> None:
        """Drops preprocessing work still queued and flushes spans (the server is stopping)."""
        self.cpu.close()
        if self.tracer is not None:
            self.tracer.shutdown()

    @classmethod
    def build(cls, engine: EngineClient, config: ServerConfig | None = None,
              metrics: ServingMetrics | None = None, *, tool_server: Any = None) -> "Servings":
        config = config or ServerConfig()
        return cls(completions=CompletionServing(engine, config, metrics),
                   chat=ChatServing(engine, config, metrics),
                   tokenize=TokenizeServing(engine, config),
                   models=ModelsServing(engine, config),
                   embeddings=EmbeddingServing(engine, config, metrics),
                   pooling=PoolingEndpointServing(engine, config, metrics),
                   classify=ClassifyServing(engine, config, metrics),
                   score=ScoreServing(engine, config, metrics),
                   rerank=RerankServing(engine, config, metrics),
                   responses=ResponsesServing(engine, config, metrics, tool_server=tool_server),
                   compare=CompareServing(engine, config),
                   neuronpedia=NeuronpediaServing(engine, config))


__all__ = [
    "ChatServing", "CompletionServing", "ModelsServing", "RequestMeta", "ServerConfig",
    "ServingError", "ServingMetrics", "Servings", "TokenizeServing", "error_response",
]
