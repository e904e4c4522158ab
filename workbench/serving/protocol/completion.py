"""`/v1/completions` request and response models, fields in the OpenAI documentation's order.

The vLLM extras follow the OpenAI fields, with vLLM's defaults. Fields this server parses
but does not implement are refused by `workbench.serving.unsupported`, never dropped.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from workbench.serving.protocol import checks
from workbench.serving.protocol.common import (
    INT64_MAX,
    INT64_MIN,
    InsideWire,
    OpenAIBaseModel,
    PromptLogprobs,
    StopParam,
    StreamOptions,
    TokenStatsWire,
    UsageInfo,
)

TokenId = Annotated[int, Field(ge=0)]


class CompletionRequest(OpenAIBaseModel):
    # OpenAI fields, in the order of https://platform.openai.com/docs/api-reference/completions
    model: str | None = None
    prompt: list[TokenId] | list[list[TokenId]] | str | list[str] | None = None
    echo: bool | None = False
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = None
    max_tokens: int | None = 16
    n: int = 1
    presence_penalty: float | None = None
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: StopParam = Field(default_factory=list)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None  # ignored, as by vLLM and OpenAI-compatible servers
    # vLLM sampling extras
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    watermarking: bool | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=INT64_MAX)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    bad_words: list[str] = Field(default_factory=list)
    # vLLM extra parameters
    prompt_embeds: Any | None = None
    add_special_tokens: bool = True
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    request_id: str | None = None
    session_id: str | None = None  # accepted and ignored: no session-affine scheduling here
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None  # refused by name (disaggregation)
    routed_experts_prompt_start: int | None = None  # refused by name (MoE routing dump)
    # vLLM's render-only fields: no effect on generation endpoints, as there
    return_token_offsets: bool | None = None
    mm_payload: Any | None = None
    return_mm_kwargs: bool | None = None
    repetition_detection: dict[str, Any] | None = None
    thinking_token_budget: int | None = None
    stream_interval: Annotated[int, Field(ge=1)] | None = None
    # workbench's inside-the-model extras (`workbench.inside.spec`; parsed and checked by
    # `SamplingParams`, resolved against the model once): activations to record, the logit
    # lens, interventions on this request's rows, an SAE's features. Not with beam search.
    capture: Any | None = None
    logit_lens: Any | None = None
    interventions: Any | None = None
    features: Any | None = None
    # workbench's `token_stats` (`SamplingParams.token_stats`): the whole distribution at each
    # position that carries logprobs (entropy, rank, top-2 margin, top-k mass)
    token_stats: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("max_tokens") is None and "max_tokens" in data:
            data = {**data, "max_tokens": 16}  # null means the default, as in vLLM
        checks.check_cache_salt(data)
        checks.check_response_format(data)
        checks.check_integer_fields(data, ("prompt_logprobs", "logprobs"))
        checks.check_prompt_logprobs(data)
        checks.check_top_k_field(data, "logprobs")
        checks.check_logprob_token_ids(data, chat=False)
        data = checks.fold_min_characters(data)
        checks.check_stream_options(data)
        checks.check_prompt_present(data)
        return data


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    token_stats: TokenStatsWire = None  # workbench's `token_stats`, one per token


class CompletionResponseChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None
    routed_experts: list | None = None  # the reference's MoE routing dump; never set here
    activations: InsideWire = None
    logit_lens: InsideWire = None
    features: InsideWire = None
    prompt_token_stats: TokenStatsWire = None  # `token_stats` with `prompt_logprobs`


class CompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    service_tier: str | None = None
    system_fingerprint: str | None = None
    usage: UsageInfo
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None  # as the reference: disaggregation only
    metrics: dict[str, Any] | None = None  # the reference's opt-in per-request metrics


class CompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    activations: InsideWire = None
    logit_lens: InsideWire = None
    features: InsideWire = None


class CompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
