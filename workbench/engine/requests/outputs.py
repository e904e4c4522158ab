"""What the engine hands back: `RequestOutput` per request, one `CompletionOutput` per sample.

Same names and fields as vLLM's `vllm.outputs`. Logprobs are a list with one dict per position,
`{token_id: Logprob}`, ordered sampled token first, then the top-k (deduplicated), as vLLM does.
`prompt_logprobs` has `None` for the first prompt position.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from workbench.engine.requests.output_views import completion_html, pooling_html, request_html

if TYPE_CHECKING:  # only an annotation: this module stays torch-free at run time
    import torch

    from workbench.inside.recorded import ActivationData, FeatureData, LogitLensData

PositionLogprobs = dict[int, "Logprob"]


@dataclass
class Logprob:
    """One token's log-probability at one position, its rank (1 = most likely) and text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class TokenStats:
    """The whole next-token distribution at one position, summed up exactly (`token_stats`):
    from the same raw logprobs over the full vocabulary as the position's logprobs, so the
    numbers do not depend on how many top logprobs were asked for (`top_k_mass` counts them).

    entropy: of the full distribution, in nats; rank: the position's token among the whole
    vocabulary (1 = most likely); margin: logprob of the best token minus the second best;
    top_k_mass: the probability of the returned top-k together (0.0 when k is 0)."""

    entropy: float
    rank: int
    margin: float
    top_k_mass: float

    def to_json(self) -> dict[str, float | int]:
        return {"entropy": self.entropy, "rank": self.rank, "margin": self.margin,
                "top_k_mass": self.top_k_mass}


@dataclass
class GrammarStep:
    """What a structured-output grammar did at one generated position: how many tokens it
    allowed, and which of the model's top candidates (by raw logprob) it masked."""

    num_allowed: int
    masked: dict[int, float] = field(default_factory=dict)  # token id -> its raw logprob

    @property
    def forced(self) -> bool:
        """Only one token was possible here."""
        return self.num_allowed == 1


@dataclass
class CompletionOutput:
    """One generated sequence of a request (there are `n` of them)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None  # matched stop string, or stop token id
    lora_request: object | None = None
    # structured outputs: one `GrammarStep` per token (None where no constraint applied yet)
    grammar_steps: list[GrammarStep | None] | None = None
    # `token_stats`: one `TokenStats` per token, beside `logprobs` (None unless asked)
    token_stats: list[TokenStats] | None = field(default=None, repr=False)

    def finished(self) -> bool:
        return self.finish_reason is not None

    def _repr_html_(self) -> str:
        return completion_html(self)


@dataclass
class RequestMetrics:
    """Timings of one request, in seconds since the epoch (`time.time()`)."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_prefill_steps: int = 0
    num_decode_steps: int = 0
    # ours: of its steps, how many also ran other requests' sequences, and the most requests
    # one of them ran (itself included), so a reader can tell whether it was batched with others
    num_shared_steps: int = 0
    max_step_requests: int = 0


@dataclass
class RequestOutput:
    """The state of one request, as of the latest engine step."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None  # None for a prompt given as embeddings
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    lora_request: object | None = None
    kv_transfer_params: dict | None = field(default=None, repr=False)
    # finish_reason "error": why the engine failed the request ("RuntimeError: ..."; the
    # engine's log has the traceback under its request id). `LLM` raises it instead.
    error: str | None = None
    # what its `capture` and `logit_lens` recorded (`workbench.inside.recorded`), once it has
    # finished: the engine's data; `LLM` hands them over as their views (`ActivationCache`,
    # `LogitLens`: `workbench.inspect`)
    activations: ActivationData | None = field(default=None, repr=False)
    logit_lens: LogitLensData | None = field(default=None, repr=False)
    # what its `features` read (`FeatureData`: an SAE's top features per position)
    features: FeatureData | None = field(default=None, repr=False)
    # `token_stats` with `prompt_logprobs`: one `TokenStats` per prompt position, beside
    # `prompt_logprobs` (None for the first position, as there)
    prompt_token_stats: list[TokenStats | None] | None = field(default=None, repr=False)
    # `prompt_distributions_from` (ours, engine-level): the full vocabulary's log-probabilities
    # of the prompt tokens from that index on, float32 [tokens, V]; never sent over HTTP
    prompt_distributions: torch.Tensor | None = field(default=None, repr=False)

    def _repr_html_(self) -> str:
        return request_html(self)


@dataclass
class PoolingOutput:
    """The pooled result of one request: an embedding, label probabilities or a score."""

    data: torch.Tensor  # [D] float32 on the CPU; empty when the request did not finish well

    def __repr__(self) -> str:
        return f"PoolingOutput(data=<tensor of shape {tuple(self.data.shape)}>)"


@dataclass
class PoolingRequestOutput:
    """One pooling request's result (vLLM's shape); `finish_reason` is ours: "stop" when pooled,
    "abort" or "error" otherwise (then `outputs.data` is empty), as `CompletionOutput`'s."""

    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    num_cached_tokens: int = 0
    finished: bool = True
    finish_reason: str = "stop"
    prompt: str | None = None
    error: str | None = None  # finish_reason "error": why, as `RequestOutput.error`

    def _repr_html_(self) -> str:
        return pooling_html(self)


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    probs: list[float]  # softmax over the labels (raw logits when use_activation=False)

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float


@dataclass
class _TypedPoolingOutput(PoolingRequestOutput):
    """A typed view of a `PoolingRequestOutput`: the same fields, `outputs` converted."""

    @classmethod
    def _view(cls, base: PoolingRequestOutput, outputs: object):
        values = {f.name: getattr(base, f.name) for f in fields(PoolingRequestOutput)}
        return cls(**{**values, "outputs": outputs})


@dataclass
class EmbeddingRequestOutput(_TypedPoolingOutput):
    """`.outputs.embedding`: list[float]."""

    @classmethod
    def from_base(cls, base: PoolingRequestOutput) -> "EmbeddingRequestOutput":
        return cls._view(base, EmbeddingOutput(base.outputs.data.tolist()))


@dataclass
class ClassificationRequestOutput(_TypedPoolingOutput):
    """`.outputs.probs`: list[float], one per label."""

    @classmethod
    def from_base(cls, base: PoolingRequestOutput) -> "ClassificationRequestOutput":
        return cls._view(base, ClassificationOutput(base.outputs.data.tolist()))


@dataclass
class ScoringRequestOutput(_TypedPoolingOutput):
    """`.outputs.score`: float."""

    @classmethod
    def from_base(cls, base: PoolingRequestOutput) -> "ScoringRequestOutput":
        data = base.outputs.data
        if data.numel() == 0 and base.finish_reason != "stop":  # aborted or failed: no score
            return cls._view(base, ScoringOutput(float("nan")))
        if data.numel() != 1:
            raise ValueError(f"A score is one number; this output has shape {tuple(data.shape)}.")
        return cls._view(base, ScoringOutput(float(data.item())))
