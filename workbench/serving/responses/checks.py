"""The Responses API's request checks: fields refused by name, tools, tool choice, store.

Messages follow the reference where it has one (`prompt`, `background`, `truncation`, tool
choice without a parser); every other field this server cannot honour is refused by name
rather than dropped (style habit 6).
"""

from __future__ import annotations

from typing import Any

from workbench.errors import ValidationError
from workbench.serving.protocol.responses import ResponsesRequest

NOT_YET = "is not supported by this server yet"
STORE_DISABLED = ("This server does not store responses (its response store size is 0), so "
                  "`store=true` cannot be honoured; send `store: false`.")
BACKGROUND_NEEDS_STORE = ("This vLLM engine does not support `store=True` and therefore does not "
                          "support the background mode. To enable these features, set the "
                          "environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when "
                          "launching the vLLM server.")


def _refuse(message: str, parameter: str, value: Any = None) -> None:
    raise ValidationError(message, parameter=parameter, value=value)


def check_request(request: ResponsesRequest, *, store_enabled: bool) -> None:
    """Everything decided from the body alone (tools are checked by `ToolSet.build`)."""
    if request.prompt is not None:
        _refuse("prompt template is not supported", "prompt")
    if request.background:
        if not store_enabled:
            _refuse(BACKGROUND_NEEDS_STORE, "background")
        if request.store is False:
            _refuse("background can only be used when `store` is true", "background")
    if not store_enabled and request.store and "store" in request.model_fields_set:
        _refuse(STORE_DISABLED, "store")
    if request.truncation == "auto":
        _refuse("truncation='auto' is not supported: a prompt that does not fit is refused.",
                "truncation")
    if request.include:
        _refuse(f"`include` ({', '.join(request.include)}) {NOT_YET}.", "include")
    if request.top_logprobs:
        _refuse(f"`top_logprobs` {NOT_YET}.", "top_logprobs")
    if request.max_output_tokens is not None and request.max_output_tokens < 1:
        _refuse(f"max_output_tokens must be at least 1, got {request.max_output_tokens}.",
                "max_output_tokens", request.max_output_tokens)
    if request.max_tool_calls is not None and request.max_tool_calls < 0:
        _refuse(f"max_tool_calls must be non-negative, got {request.max_tool_calls}.",
                "max_tool_calls", request.max_tool_calls)
    fmt = (request.text or {}).get("format") or {}
    if fmt.get("type", "text") != "text":
        _refuse(f"text.format type '{fmt.get('type')}' {NOT_YET}.", "text")
    reasoning = request.reasoning or {}
    for key in reasoning:
        if key not in ("effort",) and reasoning[key] is not None:
            _refuse(f"reasoning.{key} {NOT_YET} (only `effort`).", "reasoning")
    for name in ("structured_outputs", "cache_salt", "kv_transfer_params", "vllm_xargs",
                 "mm_processor_kwargs", "previous_input_messages"):
        if getattr(request, name) is not None:
            _refuse(f"`{name}` {NOT_YET}.", name)
