"""What the engine hands back: `RequestOutput` per request, one `CompletionOutput` per sample.

Same names and fields as vLLM's `vllm.outputs`. Logprobs are a list with one dict per position,
`{token_id: Logprob}`, ordered sampled token first, then the top-k (deduplicated), as vLLM does.
`prompt_logprobs` has `None` for the first prompt position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PositionLogprobs = dict[int, "Logprob"]


@dataclass
class Logprob:
    """One token's log-probability at one position, its rank (1 = most likely) and text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


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

    def finished(self) -> bool:
        return self.finish_reason is not None


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


@dataclass
class RequestOutput:
    """The state of one request, as of the latest engine step."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    lora_request: object | None = None
    kv_transfer_params: dict | None = field(default=None, repr=False)
