"""What travels with a request through the serving pipeline (`base.OpenAIServing`).

`RequestMeta` is what the transport knows besides the body (headers, an inspect recorder);
`ServeContext[RequestT]` is one request between the pipeline's stages, the same type for
generation (completions, chat), pooling (embeddings, classify, score, rerank, pooling) and
Responses, as vLLM's `ServeContext`: each stage reads what the stages before it left there
(`engine_prompts`, `params`, `result_generator`, `final_res_batch`) and adds its own part.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from workbench.sampling_params import BeamSearchParams
from workbench.serving.prompts import EnginePrompt
from workbench.serving.recorder import PipelineRecorder

RequestT = TypeVar("RequestT")
T = TypeVar("T")


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
class ServeContext(Generic[RequestT]):
    """One request between the pipeline's stages (see the module docstring)."""

    request: RequestT
    request_id: str  # the response id: "cmpl-...", "chatcmpl-...", "embd-...", "resp_..."
    model_name: str  # the served name it answers with (an adapter's, when it runs one)
    meta: RequestMeta = field(default_factory=RequestMeta)
    recorder: PipelineRecorder = field(default_factory=PipelineRecorder)
    engine_prompts: list[EnginePrompt] | None = None  # stage 3, preprocess
    params: list[Any] | None = None  # SamplingParams / PoolingParams, one per engine prompt
    # stage 4: (prompt index, output) pairs, merged; Responses: lists of stream events
    result_generator: AsyncGenerator[Any, None] | None = None
    final_res_batch: list[Any] | None = None  # pooling: one final output per engine prompt
    lora_request: Any = None  # the adapter it runs with (`workbench.lora`); None: base model
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.perf_counter)
    # generation
    beam: list[BeamSearchParams] | None = None  # `use_beam_search`: one per prompt
    first_token_at: float | None = None
    prompt_logprobs: dict[int, list | None] = field(default_factory=dict)
    prompt_token_stats: dict[int, list | None] = field(default_factory=dict)  # `token_stats`
    # Responses: the `ToolLoop` whose rounds the result generator runs
    loop: Any = None

    @property
    def headers(self) -> Mapping[str, str]:
        """The request's headers (trace context, for the span)."""
        return self.meta.headers

    @property
    def n(self) -> int:
        """Choices per prompt."""
        return self.beam[0].beam_width if self.beam else self.require_params()[0].n

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p.token_ids) for p in self.engine_prompts or ())

    # What a later stage reads of an earlier stage's part: the pipeline runs its stages in
    # order, so a missing part is a bug in the pipeline (RuntimeError), never in the request.
    def require_prompts(self) -> list[EnginePrompt]:
        return _stage_part(self.engine_prompts, "engine_prompts", "preprocess")

    def require_params(self) -> list[Any]:
        return _stage_part(self.params, "params", "preprocess")

    def require_generator(self) -> AsyncGenerator[Any, None]:
        return _stage_part(self.result_generator, "result_generator", "prepare generators")

    def require_results(self) -> list[Any]:
        return _stage_part(self.final_res_batch, "final_res_batch", "collect")


def _stage_part(value: T | None, name: str, stage: str) -> T:
    if value is None:
        raise RuntimeError(f"ServeContext.{name} is not set: stage {stage!r} has not run")
    return value
