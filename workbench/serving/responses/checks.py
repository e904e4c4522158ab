"""The Responses API's request checks: fields refused by name, tools, tool choice, store.

Messages follow the reference where it has one (`prompt`, `background`, `truncation`, tool
choice without a parser); every other field this server cannot honour is refused by name
rather than dropped (style habit 6).
"""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace
from typing import Any

from workbench.errors import ValidationError, refuse
from workbench.serving.protocol.responses import ResponsesRequest
from workbench.serving.responses.toolset import ToolSet, forced_name
from workbench.serving.structured import structured_outputs_from_request

logger = logging.getLogger("workbench.serving")
NOT_YET = "is not supported by this server yet"
OUTPUT_LOGPROBS = "message.output_text.logprobs"
STORE_DISABLED = ("This server does not store responses (its response store size is 0), so "
                  "`store=true` cannot be honoured; send `store: false`.")
BACKGROUND_NEEDS_STORE = ("This vLLM engine does not support `store=True` and therefore does not "
                          "support the background mode. To enable these features, set the "
                          "environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when "
                          "launching the vLLM server.")


def check_request(request: ResponsesRequest, *, store_enabled: bool) -> None:
    """Everything decided from the body alone (tools are checked by `ToolSet.build`)."""
    if request.prompt is not None:
        refuse("prompt template is not supported", "prompt")
    text = request.text or {}
    if not isinstance(text, dict):
        refuse("text must be an object.", "text", text)
    for key in text:  # OpenAI's `text` takes `format` and `verbosity`
        if key not in ("format", "verbosity"):
            refuse(f"Unknown field `text.{key}`: text takes format and verbosity.", "text")
    if text.get("verbosity") is not None:
        logger.warning("ResponsesRequest: `text.verbosity` has no effect here (a hint to "
                       "OpenAI's models; the served model takes no such hint)")
    if request.conversation is not None:
        refuse("`conversation` (OpenAI's Conversations API) is not supported here; send "
                "`previous_response_id` to continue a stored response.", "conversation")
    if request.background:
        if not store_enabled:
            refuse(BACKGROUND_NEEDS_STORE, "background")
        if request.store is False:
            refuse("background can only be used when `store` is true", "background")
    if not store_enabled and request.store and "store" in request.model_fields_set:
        refuse(STORE_DISABLED, "store")
    if request.truncation == "auto":
        refuse("truncation='auto' is not supported: a prompt that does not fit is refused.",
                "truncation")
    other = [value for value in request.include or [] if value != OUTPUT_LOGPROBS]
    if other:
        refuse(f"`include` ({', '.join(other)}) {NOT_YET}; it takes {OUTPUT_LOGPROBS!r}.",
                "include", other)
    if request.top_logprobs and OUTPUT_LOGPROBS not in (request.include or []):
        refuse(f"`top_logprobs` needs include=['{OUTPUT_LOGPROBS}'].", "top_logprobs",
                request.top_logprobs)
    if request.top_logprobs is not None and not 0 <= request.top_logprobs <= 20:
        refuse(f"top_logprobs must be between 0 and 20, got {request.top_logprobs}.",
                "top_logprobs", request.top_logprobs)
    if request.max_output_tokens is not None and request.max_output_tokens < 1:
        refuse(f"max_output_tokens must be at least 1, got {request.max_output_tokens}.",
                "max_output_tokens", request.max_output_tokens)
    if request.max_tool_calls is not None and request.max_tool_calls < 0:
        refuse(f"max_tool_calls must be non-negative, got {request.max_tool_calls}.",
                "max_tool_calls", request.max_tool_calls)
    reasoning = request.reasoning or {}
    for key in reasoning:
        if key not in ("effort",) and reasoning[key] is not None:
            refuse(f"reasoning.{key} {NOT_YET} (only `effort`).", "reasoning")
    if request.watermarking:
        refuse(f"`watermarking` {NOT_YET}.", "watermarking")
    if request.media_io_kwargs:
        refuse("`media_io_kwargs` is not supported: the served model is text-only.",
                "media_io_kwargs")
    for name in ("cache_salt", "kv_transfer_params", "vllm_xargs",
                 "mm_processor_kwargs", "previous_input_messages"):
        if getattr(request, name) is not None:
            refuse(f"`{name}` {NOT_YET}.", name)


def structured_outputs(request: ResponsesRequest) -> Any:
    """`text.format` (json_schema / json_object) or vLLM's `structured_outputs` as the
    engine's `StructuredOutputsParams`, None for plain text; not both, and not with tools."""
    fmt = (request.text or {}).get("format") or {"type": "text"}
    if not isinstance(fmt, dict):
        refuse("text.format must be an object.", "text", fmt)
    kind = fmt.get("type", "text")
    response_format = None
    if kind == "json_schema":
        response_format = {"type": "json_schema", "json_schema": {
            "name": fmt.get("name"), "schema": fmt.get("schema")}}
    elif kind != "text":
        response_format = {"type": kind}
    if response_format and request.structured_outputs:
        refuse("`text.format` and `structured_outputs` cannot be used together.", "text")

    fields = SimpleNamespace(response_format=response_format,  # what the chat helper reads
                             structured_outputs=request.structured_outputs)
    try:
        params = structured_outputs_from_request(fields)
    except ValidationError as exc:  # name the Responses field
        message = exc.message.replace("response_format.json_schema.", "text.format.")
        raise ValidationError(message.replace("response_format", "text.format"),
                              parameter="text" if response_format else "structured_outputs",
                              value=exc.value) from None
    if params is None:
        return None
    parameter = "text" if response_format else "structured_outputs"
    if request.tools and request.tool_choice != "none":
        refuse("You can only either use constraints for structured outputs or tools, not both.",
                parameter)
    return dataclasses.replace(params, parameter=parameter)  # engine errors name it


def wants_logprobs(request: ResponsesRequest, *, parsed: bool) -> bool:
    """`include` asks for output-text logprobs; only where text maps to tokens one to one
    (no tool or reasoning parser splitting it)."""
    if OUTPUT_LOGPROBS not in (request.include or []):
        return False
    if parsed:
        refuse(f"include=['{OUTPUT_LOGPROBS}'] {NOT_YET} with tools or a reasoning parser "
                "(their text does not map to the output tokens one to one).", "include")
    return True


def check_tool_choice(request: ResponsesRequest, tools: ToolSet, *, auto_tools: bool,
                      tool_parser_name: str | None) -> None:
    """The reference's tool-choice rules: `auto` needs --enable-auto-tool-choice and a
    parser; `required` and named choices need a parser (for the rounds after the first)."""
    choice = request.tool_choice
    if isinstance(choice, dict):
        name = forced_name(choice)
        if name is None or not (tools.is_builtin(name) or any(
                t["function"]["name"] == name for t in tools.functions)):
            raise ValidationError("The tool specified in `tool_choice` does not match any of "
                                  "the specified `tools`", parameter="tool_choice")
    elif choice not in ("none", "auto", "required"):
        raise ValidationError(
            f"Invalid value for `tool_choice`: {choice}! Only named tools, \"none\", "
            "\"auto\" or \"required\" are supported.", parameter="tool_choice")
    if not tools or choice == "none":
        return
    if choice == "auto" and not (auto_tools and tool_parser_name):
        raise ValidationError('"auto" tool choice requires --enable-auto-tool-choice and '
                              "--tool-call-parser to be set", parameter="tool_choice")
    if tool_parser_name is None:
        raise ValidationError('tool_choice="required" requires --tool-call-parser to be set',
                              parameter="tool_choice")
