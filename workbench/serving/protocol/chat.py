"""`/v1/chat/completions` request and response models, fields in the OpenAI documentation's order.

Messages keep OpenAI's shape (role, content as a string or a list of parts, tool calls);
`workbench.serving.chat_template` turns them into the template's conversation.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import Field, model_serializer, model_validator

from workbench.errors import ValidationError
from workbench.serving.protocol import checks
from workbench.serving.protocol.common import (
    INT64_MAX,
    INT64_MIN,
    InsideWire,
    Metadata,
    OpenAIBaseModel,
    PromptLogprobs,
    StopParam,
    StreamOptions,
    TokenStatsWire,
    UsageInfo,
)
from workbench.serving.protocol.tools import DeltaToolCall, ToolCall

# The usual roles are system, developer, user, assistant, tool and function; as the reference,
# any other role is passed to the chat template, which decides what it means.
Role = str


class ChatMessageParam(OpenAIBaseModel):
    """One input message: `content` is a string, a list of content parts, or null."""

    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None


class FunctionDefinition(OpenAIBaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    # OpenAI's: the call's arguments always match `parameters`; here that holds for
    # `required` / named choices (constrained decoding), not for `auto` (a warning says so)
    strict: bool | None = None
    defer_loading: bool | None = None  # vLLM's; no effect here (every tool is rendered)


class ChatCompletionToolsParam(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ChatCompletionRequest(OpenAIBaseModel):
    # OpenAI fields, in the order of https://platform.openai.com/docs/api-reference/chat/create
    messages: list[ChatMessageParam]
    model: str | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None  # deprecated by OpenAI; max_completion_tokens wins
    max_completion_tokens: int | None = None
    n: int | None = 1
    presence_penalty: float | None = None
    response_format: dict[str, Any] | None = None
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: StopParam = Field(default_factory=list)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: str | dict[str, Any] | None = "none"
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    thinking_token_budget: int | None = None
    include_reasoning: bool = True  # with --reasoning-parser: return `reasoning`
    parallel_tool_calls: bool | None = True
    user: str | None = None  # ignored, as by vLLM
    # OpenAI fields with no effect on the output here (unsupported.NO_EFFECT lists why; the
    # validation report and a warning say so), or refused by value (`unsupported.check_chat`)
    audio: dict[str, Any] | None = None
    function_call: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    metadata: Metadata | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    store: bool | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    web_search_options: dict[str, Any] | None = None
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
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = Field(default_factory=list)
    # vLLM extra parameters
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    request_id: str | None = None
    session_id: str | None = None  # accepted and ignored: no session-affine scheduling here
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    return_prompt_text: bool | None = None
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
        data = _rename_reasoning_content(data)
        _check_user_content(data)
        checks.check_cache_salt(data)
        checks.check_response_format(data)
        data = checks.fold_min_characters(data)
        checks.check_stream_options(data)
        checks.check_integer_fields(data, ("prompt_logprobs", "top_logprobs"))
        checks.check_prompt_logprobs(data)
        _check_top_logprobs(data)
        checks.check_logprob_token_ids(data, chat=True)
        data = _check_tool_usage(data)
        if data.get("continue_final_message") and data.get("add_generation_prompt"):
            raise ValidationError("Cannot set both `continue_final_message` and "
                                  "`add_generation_prompt` to True.")
        return data


def _rename_reasoning_content(data: dict[str, Any]) -> dict[str, Any]:
    """vLLM renames the deprecated `reasoning_content` of input messages to `reasoning`."""
    messages = data.get("messages")
    if not isinstance(messages, list):
        return data
    renamed = []
    for message in messages:
        if isinstance(message, dict) and "reasoning_content" in message:
            message = dict(message)
            content = message.pop("reasoning_content")
            if message.get("reasoning") is None:
                message["reasoning"] = content
        renamed.append(message)
    return {**data, "messages": renamed}


def _check_user_content(data: dict[str, Any]) -> None:
    """OpenAI refuses a `user` message without `content` (vLLM renders it as empty text)."""
    messages = data.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if (isinstance(message, dict) and message.get("role") == "user"
                and message.get("content") is None):
            raise ValidationError(f"Missing required parameter: 'messages[{i}].content'.",
                                  parameter=f"messages.{i}.content")


def _check_top_logprobs(data: dict[str, Any]) -> None:
    checks.check_top_k_field(data, "top_logprobs")
    top = data.get("top_logprobs")
    if top is not None and (top == -1 or top > 0) and not data.get("logprobs"):
        raise ValidationError("when using `top_logprobs`, `logprobs` must be set to true.",
                              parameter="top_logprobs")


def _check_tool_usage(data: dict[str, Any]) -> dict[str, Any]:
    """vLLM's `check_tool_usage`: shape of `tools` / `tool_choice`, before any parser."""
    if data.get("tools") == []:
        raise ValidationError("`tools` must not be an empty array. Either provide at least one "
                              "tool or omit the field entirely.", parameter="tools")
    if "tool_choice" not in data and data.get("tools"):
        data = {**data, "tool_choice": "auto"}
    choice = data.get("tool_choice")
    if choice is None or choice == "none":
        return data
    if data.get("tools") is None:
        raise ValidationError("When using `tool_choice`, `tools` must be set.",
                              parameter="tool_choice")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise ValidationError(f"Invalid value for `tool_choice`: {choice}! Only named tools, "
                              '"none", "auto" or "required" are supported.',
                              parameter="tool_choice")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if isinstance(
            choice.get("function"), dict) else None
        names = [t.get("function", {}).get("name") for t in data["tools"] if isinstance(t, dict)]
        if name not in names:
            raise ValidationError("The tool specified in `tool_choice` does not match any of the "
                                  "specified `tools`", parameter="tool_choice")
    return data


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | None = None
    refusal: str | None = None
    annotations: Any | None = None
    audio: Any | None = None
    function_call: Any | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    reasoning: str | None = None

    @model_serializer(mode="wrap")
    def _omit_empty_tool_calls(self, handler):
        data = handler(self)
        if not data.get("tool_calls"):
            data.pop("tool_calls", None)
        return data


class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None
    token_stats: TokenStatsWire = None  # workbench's `token_stats`, one per content entry


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    routed_experts: list | None = None  # the reference's MoE routing dump; never set here
    activations: InsideWire = None
    logit_lens: InsideWire = None
    features: InsideWire = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    service_tier: str | None = None
    system_fingerprint: str | None = None
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_stats: TokenStatsWire = None  # `token_stats` with `prompt_logprobs`
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None  # as the reference: disaggregation only
    metrics: dict[str, Any] | None = None  # the reference's opt-in per-request metrics


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] = Field(default_factory=list)


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    activations: InsideWire = None
    logit_lens: InsideWire = None
    features: InsideWire = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_text: str | None = None
