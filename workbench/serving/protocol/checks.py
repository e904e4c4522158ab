"""Request checks that run on the raw JSON before field validation, as vLLM's validators.

Each function takes the request dict and raises `ValidationError` naming the parameter; the
request models call them from `model_validator(mode="before")`, so a bad request never
becomes a model. Messages are vLLM's, word for word.
"""

from __future__ import annotations

from typing import Any

from workbench.errors import ValidationError

MAX_COMPLETION_PROMPTS = 1024
_CACHE_SALT_FORBIDDEN = ("@", "/", "\\", "\x00")


def check_stream_options(data: dict[str, Any]) -> None:
    if data.get("stream_options") and not data.get("stream"):
        raise ValidationError("Stream options can only be defined when `stream=True`.",
                              parameter="stream_options")


def check_min_characters(value: Any, parameter: str) -> Any:
    """At least 1 (an integer, not a JSON `true`), or a 400 naming `parameter`."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ValidationError(f"`{parameter}` must be an integer of at least 1.",
                              parameter=parameter, value=value)
    return value


def fold_min_characters(data: dict[str, Any]) -> dict[str, Any]:
    """A top-level `min_characters` (where vLLM's own stream-options test sends it, through
    the client's `extra_body`) is `stream_options.min_characters`; both given must agree."""
    if data.get("min_characters") is None:
        return data
    data = dict(data)
    value = check_min_characters(data.pop("min_characters"), "min_characters")
    if not data.get("stream"):
        raise ValidationError("`min_characters` applies to streamed responses: it can only be "
                              "defined when `stream=True`.", parameter="min_characters")
    options = data.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return data  # the schema refuses it by name
    options = dict(options or {})
    if options.get("min_characters") not in (None, value):
        raise ValidationError("`min_characters` and `stream_options.min_characters` differ; "
                              "give one.", parameter="min_characters")
    data["stream_options"] = {**options, "min_characters": value}
    return data


def check_integer_fields(data: dict[str, Any], names: tuple[str, ...]) -> None:
    """As vLLM: a number (a JSON `true` counts as 1, as there) or a 400 naming the field."""
    for name in names:
        value = data.get(name)
        if value is not None and not isinstance(value, (int, float)):
            raise ValidationError(f"`{name}` must be an integer.", parameter=name, value=value)


def check_prompt_logprobs(data: dict[str, Any]) -> None:
    prompt_logprobs = data.get("prompt_logprobs")
    if prompt_logprobs is None:
        return
    if data.get("stream") and (prompt_logprobs > 0 or prompt_logprobs == -1):
        raise ValidationError("`prompt_logprobs` are not available when `stream=True`.",
                              parameter="prompt_logprobs")
    if prompt_logprobs < 0 and prompt_logprobs != -1:
        raise ValidationError("`prompt_logprobs` must be a positive value or -1.",
                              parameter="prompt_logprobs", value=prompt_logprobs)


def check_logprob_token_ids(data: dict[str, Any], *, chat: bool) -> None:
    """`logprob_token_ids` needs logprobs on, and not beam search (vLLM's messages)."""
    if not data.get("logprob_token_ids"):
        return
    if data.get("use_beam_search"):
        raise ValidationError("`logprob_token_ids` is not supported with beam search.",
                              parameter="logprob_token_ids")
    if not data.get("logprobs") if chat else data.get("logprobs") is None:
        raise ValidationError("when using `logprob_token_ids`, `logprobs` must be set"
                              + (" to true." if chat else "."), parameter="logprob_token_ids")


def check_top_k_field(data: dict[str, Any], name: str) -> None:
    """`logprobs` (completions) or `top_logprobs` (chat): a count >= 0, or -1 for the vocabulary."""
    value = data.get(name)
    if value is not None and value < 0 and value != -1:
        raise ValidationError(f"`{name}` must be a positive value or -1.",
                              parameter=name, value=value)


def check_cache_salt(data: dict[str, Any]) -> None:
    salt = data.get("cache_salt")
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise ValidationError("Parameter 'cache_salt' must be a non-empty string if provided.",
                              parameter="cache_salt")
    if len(salt) > 128 or any(c in salt for c in _CACHE_SALT_FORBIDDEN):
        raise ValidationError(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain "
            "'@', '/', '\\', or NUL.", parameter="cache_salt")


def check_prompt_present(data: dict[str, Any]) -> None:
    prompt = data.get("prompt")
    embeds = data.get("prompt_embeds")
    prompt_empty = prompt is None or prompt == ""
    embeds_empty = embeds is None or (isinstance(embeds, list) and not embeds)
    if prompt_empty and embeds_empty:
        raise ValidationError("Either prompt or prompt_embeds must be provided and non-empty.",
                              parameter="prompt")
    if (isinstance(prompt, list) and prompt and not all(isinstance(p, int) for p in prompt)
            and len(prompt) > MAX_COMPLETION_PROMPTS):
        raise ValidationError(
            f"prompt list length {len(prompt)} exceeds the maximum allowed count of "
            f"{MAX_COMPLETION_PROMPTS}. To increase this limit, set the "
            "VLLM_MAX_COMPLETION_PROMPTS environment variable.", parameter="prompt")


def check_response_format(data: dict[str, Any]) -> None:
    response_format = data.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema" \
            and response_format.get("json_schema") is None:
        raise ValidationError("When response_format type is 'json_schema', the 'json_schema' "
                              "field must be provided.", parameter="response_format")
