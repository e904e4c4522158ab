"""Models shared by every endpoint: the base model, the error envelope, usage, model cards.

`OpenAIBaseModel` keeps unknown fields aside (`model_extra`) and logs them at WARNING; every
endpoint then refuses them by name (`unsupported.refuse_unknown_fields`), so a misspelt field
never silently runs at a default.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from workbench.errors import ValidationError
from workbench.serving.protocol.checks import check_min_characters

logger = logging.getLogger("workbench.serving")

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_STOP_STRINGS = 4  # vLLM's VLLM_MAX_STOP_STRINGS default

StopParam = str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None

# OpenAI's limits on `metadata` (chat, Responses): 16 pairs, keys of 64 and values of 512
# characters, so a stored response's metadata stays small whatever a client sends
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


def _check_metadata(value: dict[str, str]) -> dict[str, str]:
    if len(value) > MAX_METADATA_PAIRS:
        raise ValidationError(
            f"Invalid 'metadata': too many properties. Expected an object with at most "
            f"{MAX_METADATA_PAIRS} properties, but got an object with {len(value)} properties "
            "instead.", parameter="metadata")
    for key, text in value.items():
        for what, limit, item in (("key", MAX_METADATA_KEY, key),
                                  ("value", MAX_METADATA_VALUE, text)):
            if len(item) > limit:
                raise ValidationError(
                    f"Invalid 'metadata': {what} too long. Expected a string with maximum "
                    f"length {limit}, but got a string with length {len(item)} instead.",
                    parameter="metadata")
    return value


Metadata = Annotated[dict[str, str], AfterValidator(_check_metadata)]


class OpenAIBaseModel(BaseModel):
    """Base of every request and response model; unknown request fields are logged."""

    model_config = ConfigDict(extra="allow")

    def model_post_init(self, context: Any, /) -> None:
        if self.model_extra:
            logger.warning("%s: unknown fields %s", type(self).__name__,
                           sorted(self.model_extra))


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    """`{"error": {"message", "type", "param", "code"}}`; the HTTP status equals `code`."""

    error: ErrorInfo


class PromptTokenUsageInfo(OpenAIBaseModel):
    cached_tokens: int | None = None


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None
    # the reference fills it only with a reasoning parser (reasoning_tokens); none here yet
    completion_tokens_details: dict[str, int] | None = None


class StreamOptions(OpenAIBaseModel):
    """As vLLM's: no usage chunk unless `include_usage` is true; `min_characters`: the least
    text a streamed chunk of a choice carries (`streaming.hold_back`); OpenAI's
    `include_obfuscation` has no effect (no padding is sent); other keys are refused."""

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False
    min_characters: int | None = None
    include_obfuscation: bool | None = None

    @field_validator("min_characters", mode="before")
    @classmethod
    def _positive(cls, value: Any) -> Any:
        return check_min_characters(value, "stream_options.min_characters")

    @model_validator(mode="after")
    def _refuse_unknown(self) -> "StreamOptions":
        for name in sorted(self.model_extra or {}):
            raise ValidationError(f"Unknown field `stream_options.{name}`: stream_options "
                                  "takes include_usage, continuous_usage_stats, "
                                  "min_characters and include_obfuscation.",
                                  parameter="stream_options")
        return self


class PromptLogprob(OpenAIBaseModel):
    """One entry of `prompt_logprobs[pos][token_id]`."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, PromptLogprob] | None]

# A choice's `activations` (`ActivationCache.to_wire()`), `logit_lens` (`LogitLens.to_wire()`) and
# `features` (`FeatureData.to_wire()`), workbench extras: the keys are absent unless the request
# asked for `capture` / `logit_lens` / `features`
# (JSON that only a workbench server sends; vLLM's clients never see them)
InsideWire = Annotated[dict[str, Any] | None, Field(default=None, exclude_if=lambda v: v is None)]

# `token_stats` (`workbench.engine.requests.outputs.TokenStats.to_json()`: entropy, rank, margin,
# top_k_mass) per position of a choice's logprobs (`token_stats`) or of the prompt
# (`prompt_token_stats`, None for the first position); a workbench extra, absent unless asked
TokenStatsWire = Annotated[list[dict[str, float | int] | None] | None,
                           Field(default=None, exclude_if=lambda v: v is None)]


class ModelPermission(OpenAIBaseModel):
    id: str
    object: str = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(OpenAIBaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "workbench"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=list)
    # ours, on the base model's card: the arithmetic it was started with (`dtype`, and for a
    # GGUF model's blocks `gguf_activations`: "float32", or "q8", llama.cpp's), `batch_invariant`
    arithmetic: dict[str, Any] | None = None
    # ours, on the base model's card: the sparse autoencoders loaded (name, hook_name,
    # architecture, d_in, d_sae), absent without any
    saes: Annotated[list[dict[str, Any]] | None, Field(default=None,
                                                       exclude_if=lambda v: v is None)] = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)
