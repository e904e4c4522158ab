"""The field policy: what each endpoint does with a field it parses but does not honour.

Every field the OpenAI API defines for an endpoint is accepted (SDKs and frameworks send
`store`, `metadata`, `service_tier`, ...): one that changes nothing here is listed in
`NO_EFFECT` (by request model) with the reason, shown as `ignored` in the validation report
and logged once per request as a warning; one whose value asks for something this server
cannot do (audio output, web search) is refused by name. vLLM's extras likewise. A name that
neither defines is refused by name (vLLM drops it, so a typo such as `temprature` silently
samples at the default), and a field that would change the output is never dropped silently
(vLLM ignores the removed `guided_*` fields and returns unconstrained text; we answer 400).
"""

from __future__ import annotations

import logging
from typing import Any

from workbench.errors import refuse
from workbench.serving.errors import ServingError, make_error

logger = logging.getLogger("workbench.serving")

IGNORED_FIELDS = {
    "user": "identifies the end user to OpenAI; no effect on generation",
    "session_id": "session affinity for routers; single engine here",
}

_CACHE_KEY = ("a routing hint for OpenAI's prompt cache; this server's prefix cache matches by "
              "content (use `cache_salt` to keep a tenant's blocks apart); no effect")
_NO_EFFECT_CHAT = {
    **IGNORED_FIELDS,
    "metadata": "kept by OpenAI with stored completions; nothing is stored here; no effect",
    "store": "OpenAI stores the completion for evals and distillation; nothing is stored "
             "here; no effect",
    "service_tier": "OpenAI's processing tier; one tier here (the response's `service_tier` "
                    "is null, as vLLM's); no effect",
    "prompt_cache_key": _CACHE_KEY,
    "prompt_cache_retention": "how long OpenAI keeps a cached prefix; the prefix cache here "
                              "keeps blocks until it needs the room; no effect",
    "safety_identifier": "identifies the end user to OpenAI's abuse detection; no effect",
    "verbosity": "a hint to OpenAI's models; the served model takes no such hint; no effect",
    "modalities": "[\"text\"] is what this server produces; no effect",
    "prediction": "predicted output speeds OpenAI's decoding up without changing it; no "
                  "effect here",
}
_NO_EFFECT_RESPONSES = {
    "user": IGNORED_FIELDS["user"],
    "prompt_cache_key": _CACHE_KEY,
    "prompt_cache_retention": _NO_EFFECT_CHAT["prompt_cache_retention"],
    "safety_identifier": _NO_EFFECT_CHAT["safety_identifier"],
    "stream_options": "`include_obfuscation` pads OpenAI's stream events; no padding is sent "
                      "here; no effect",
}
_RENDER_ONLY = {name: "a field of vLLM's /render endpoints; no effect on generation, as vLLM"
                for name in ("return_token_offsets", "mm_payload", "return_mm_kwargs")}
_NO_EFFECT_CHAT.update(_RENDER_ONLY)
_NO_EFFECT_RESPONSES["session_id"] = IGNORED_FIELDS["session_id"]
# request model name -> {field: why it has no effect}; other models: IGNORED_FIELDS
NO_EFFECT = {"ChatCompletionRequest": _NO_EFFECT_CHAT, "ResponsesRequest": _NO_EFFECT_RESPONSES,
             "CompletionRequest": {**IGNORED_FIELDS, **_RENDER_ONLY}}


def no_effect_fields(request: Any) -> dict[str, str]:
    """The fields of this request's endpoint that are accepted with no effect, and why."""
    return NO_EFFECT.get(type(request).__name__, IGNORED_FIELDS)


def warn_no_effect(request: Any) -> None:
    """One warning line naming the set fields that have no effect here (and why)."""
    reasons = no_effect_fields(request)
    named = [name for name in sorted(request.model_fields_set)
             if name in reasons and getattr(request, name, None) is not None]
    if named:
        logger.warning("%s: %s", type(request).__name__, "; ".join(
            f"`{name}` has no effect here ({reasons[name]})" for name in named))

# As in the reference, beam search takes only width, length, EOS handling, length_penalty and
# temperature; it accepts these sampling fields without using them. The validation report
# lists them as ignored for such requests, so nothing is dropped out of sight.
BEAM_IGNORED_FIELDS = {
    name: "not used by beam search (as the reference), which ranks by raw logprobs"
    for name in ("stop", "stop_token_ids", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "top_p", "top_k", "min_p", "seed", "logit_bias",
                 "min_tokens", "bad_words", "allowed_token_ids", "logprobs", "top_logprobs",
                 "prompt_logprobs")
}

_NOT_YET = "is not supported by this server yet"
# what a request sees or changes inside the model (`workbench.inside.spec`): completions and
# chat completions only, one sampled sequence each
INSIDE_FIELDS = ("capture", "logit_lens", "interventions", "features")
# workbench's extras of completions and chat completions: the inside fields and `token_stats`
WORKBENCH_FIELDS = (*INSIDE_FIELDS, "token_stats")
_REMOVED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
            "guided_decoding_backend", "guided_whitespace_pattern")


def _answer(message: str, parameter: str | None = None) -> None:
    """A refusal vLLM answers as a plain error response (no `(parameter=...)` suffix; its
    `param` only where vLLM names one)."""
    raise ServingError(make_error(message, param=parameter))


def check_common(request: Any) -> None:
    """Refusals shared by completions and chat completions."""
    for name in ("kv_transfer_params", "ec_transfer_params", "routed_experts_prompt_start",
                 "vllm_xargs", "repetition_detection", "stream_interval"):
        if getattr(request, name) is not None:
            refuse(f"`{name}` {_NOT_YET}.", name)
    if request.watermarking:
        refuse(f"`watermarking` {_NOT_YET}.", "watermarking")
    if request.thinking_token_budget not in (None, -1) and request.use_beam_search:
        refuse("`thinking_token_budget` is not supported with beam search.",
                "thinking_token_budget")
    for name in INSIDE_FIELDS:
        if getattr(request, name) not in (None, []) and request.use_beam_search:
            refuse(f"`{name}` is not supported with beam search (it records or changes one "
                   "sampled sequence; beam search runs many).", name)
    if request.token_stats and request.use_beam_search:
        refuse("`token_stats` is not supported with beam search (it describes the logprobs of "
               "sampled positions; beam search returns none).", "token_stats")
    extra = request.model_extra or {}
    for name in _REMOVED:
        if extra.get(name) is not None:
            refuse(f"`{name}` was removed from the API (vLLM ignores it and returns "
                    "unconstrained text); use `structured_outputs` or `response_format`.",
                    name)
    if extra.get("best_of") not in (None, 1):
        refuse("`best_of` was removed from the API and is not supported.", "best_of",
                extra.get("best_of"))
    refuse_unknown_fields(request)


def refuse_unknown_fields(request: Any) -> None:
    """A field the request model does not know is refused by name (vLLM accepts and drops it,
    so a typo such as `temprature` silently samples at the default)."""
    extra = sorted(name for name in (request.model_extra or {}) if name != "best_of")
    inside = [name for name in extra if name in WORKBENCH_FIELDS]
    if inside:  # a workbench extra sent to an endpoint that does not run it
        refuse(f"`{inside[0]}` applies to /v1/completions and /v1/chat/completions only; "
               f"{type(request).__name__} does not take it.", inside[0])
    if extra:
        refuse(f"Unknown field `{extra[0]}`: it is not part of this endpoint's request body "
                "(check its spelling). Unknown fields are refused rather than ignored.", extra[0])
    warn_no_effect(request)


def check_completion(request: Any, *, enable_prompt_embeds: bool = False) -> None:
    """vLLM's completion-only checks, in its order, then the common refusals."""
    if request.thinking_token_budget not in (None, -1):
        refuse("`thinking_token_budget` applies to chat completions (the reasoning parser "
                "reads the chat prompt); it is not supported on /v1/completions.",
                "thinking_token_budget")
    if request.echo and request.suffix is not None:
        refuse("Echo is unsupported with suffix.", "echo")
    if request.echo and request.prompt_embeds is not None:
        _answer("Echo is unsupported with prompt embeds.")
    if request.prompt_logprobs is not None and request.prompt_embeds is not None:
        _answer("prompt_logprobs is not compatible with prompt embeds.")
    if request.prompt_embeds is not None and not enable_prompt_embeds:
        refuse("You must set `--enable-prompt-embeds` to input `prompt_embeds`.", "prompt_embeds")
    if request.prompt_embeds is not None and request.use_beam_search:
        refuse("Beam search is not supported with prompt embeds.", "prompt_embeds")
    if request.suffix is not None:
        refuse("suffix is only supported for models with FIM completion rendering", "suffix")
    if request.use_beam_search and request.echo and request.logprobs is not None:
        refuse("`echo` with `logprobs` is not supported with beam search because beam search "
                "does not compute prompt logprobs.", "echo")
    if request.use_beam_search and request.stream:
        refuse("Streaming is not currently supported with beam search", "stream")
    check_common(request)


def check_chat(request: Any) -> None:
    """Chat-only refusals (multimodal kwargs), then the common ones. Tool-choice rules that
    depend on the server's parsers are in `chat_tools.ChatTools.check`."""
    for name in ("media_io_kwargs", "mm_processor_kwargs"):
        if getattr(request, name):
            refuse(f"`{name}` is not supported: the served model is text-only.", name)
    if request.audio is not None or "audio" in (request.modalities or []):
        refuse("Audio output is not supported: the served model produces text only "
                "(`modalities` may only be [\"text\"]).",
                "audio" if request.audio is not None else "modalities")
    if any(m != "text" for m in request.modalities or []):
        refuse(f"`modalities` may only contain \"text\", got {request.modalities}.",
                "modalities", request.modalities)
    if request.web_search_options is not None:
        refuse("`web_search_options`: this server has no web search.", "web_search_options")
    for name in ("functions", "function_call"):
        if getattr(request, name) is not None:
            refuse(f"`{name}` is deprecated by OpenAI and not supported here; send `tools` "
                    "and `tool_choice`.", name)
    strict = [t.function.name for t in request.tools or () if t.function.strict]
    if strict and request.tool_choice == "auto":
        logger.warning("ChatCompletionRequest: `strict` tools %s: with tool_choice \"auto\" "
                       "the arguments are parsed, not constrained (required and named choices "
                       "are); they may not match the schema", strict)
    check_common(request)
