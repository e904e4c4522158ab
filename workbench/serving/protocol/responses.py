"""`/v1/responses` request and response models (OpenAI's Responses API, vLLM's extras).

Input is a string or a list of items (messages with `input_text` parts, `function_call` and
`function_call_output` items, earlier output items); tools are flat function tools
(`{"type": "function", "name", "parameters"}`) or built-in tools named by `type` (the tool
server's names, e.g. `{"type": "calculator"}`). Output items are plain dicts in OpenAI's shapes
(`message`, `reasoning`, `function_call`, `function_call_output`), built by
`workbench.serving.responses.items`.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field

from workbench.serving.protocol.common import (
    INT64_MAX,
    INT64_MIN,
    Metadata,
    OpenAIBaseModel,
    StopParam,
)

ResponseStatus = Literal["completed", "incomplete", "in_progress", "queued", "cancelled", "failed"]


class ResponsesRequest(OpenAIBaseModel):
    # OpenAI fields, in the order of https://platform.openai.com/docs/api-reference/responses/create
    input: str | list[dict[str, Any]]
    model: str | None = None
    background: bool | None = False
    include: list[str] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: Metadata | None = None
    parallel_tool_calls: bool | None = True
    previous_response_id: str | None = None
    prompt: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str | None = "auto"
    store: bool | None = True
    stream: bool | None = False
    temperature: float | None = None
    text: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_logprobs: int | None = 0
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] | None = "disabled"
    user: str | None = None  # ignored, as by vLLM
    # OpenAI fields with no effect here (unsupported.NO_EFFECT) or refused by value
    conversation: str | dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None
    # vLLM extras
    request_id: str | None = None
    priority: int = 0
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    stop: StopParam = Field(default_factory=list)
    stop_token_ids: list[int] | None = Field(default_factory=list)
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = None
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    previous_input_messages: list[dict[str, Any]] | None = None
    enable_response_messages: bool = False
    session_id: str | None = None  # no effect: no session-affine scheduling here
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    media_io_kwargs: dict[str, Any] | None = None  # refused by name: text-only model
    watermarking: bool | None = None  # refused by name


class InputTokensDetails(OpenAIBaseModel):
    cached_tokens: int = 0
    input_tokens_per_turn: list[int] = Field(default_factory=list)


class OutputTokensDetails(OpenAIBaseModel):
    reasoning_tokens: int = 0
    tool_output_tokens: int = 0
    output_tokens_per_turn: list[int] = Field(default_factory=list)
    tool_output_tokens_per_turn: list[int] = Field(default_factory=list)


class ResponseUsage(OpenAIBaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(OpenAIBaseModel):
    # max_output_tokens (the request's budget), context_length (the next turn would not fit
    # in max_model_len), max_tool_calls (the model asked for a built-in tool past the cap)
    reason: str


class ResponsesResponse(OpenAIBaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: ResponseStatus = "completed"
    background: bool = False
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: Metadata | None = None
    model: str
    output: list[dict[str, Any]] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    service_tier: str | None = "auto"
    store: bool = True
    temperature: float | None = None
    text: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: str | None = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    input_messages: list[dict[str, Any]] | None = None
    output_messages: list[dict[str, Any]] | None = None

    @property
    def output_text(self) -> str:
        """The text of every output message, joined (as the openai client's `output_text`)."""
        return "".join(part.get("text", "") for item in self.output if item.get("type") == "message"
                       for part in item.get("content", []) if part.get("type") == "output_text")
