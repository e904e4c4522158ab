"""Request fields this server parses but cannot honour yet: each one is refused, by name.

A field that would change the output is never dropped silently (vLLM, for example, ignores the
removed `guided_*` fields and returns unconstrained text; we answer 400 instead). Fields that
change nothing about the output are listed in `IGNORED_FIELDS` and accepted.
"""

from __future__ import annotations

from typing import Any

from workbench.errors import ValidationError

IGNORED_FIELDS = {
    "user": "identifies the end user to OpenAI; no effect on generation",
    "session_id": "session affinity for routers; single engine here",
}

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
_REMOVED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
            "guided_decoding_backend", "guided_whitespace_pattern")


def _refuse(message: str, parameter: str, value: Any = None) -> None:
    raise ValidationError(message, parameter=parameter, value=value)


def check_common(request: Any) -> None:
    """Refusals shared by completions and chat completions."""
    for name in ("kv_transfer_params", "vllm_xargs",
                 "repetition_detection", "stream_interval"):
        if getattr(request, name) is not None:
            _refuse(f"`{name}` {_NOT_YET}.", name)
    if request.watermarking:
        _refuse(f"`watermarking` {_NOT_YET}.", "watermarking")
    if request.thinking_token_budget not in (None, -1) and request.use_beam_search:
        _refuse("`thinking_token_budget` is not supported with beam search.",
                "thinking_token_budget")
    extra = request.model_extra or {}
    for name in _REMOVED:
        if extra.get(name) is not None:
            _refuse(f"`{name}` was removed from the API (vLLM ignores it and returns "
                    "unconstrained text); use `structured_outputs` or `response_format`.",
                    name)
    if extra.get("best_of") not in (None, 1):
        _refuse("`best_of` was removed from the API and is not supported.", "best_of",
                extra.get("best_of"))
    refuse_unknown_fields(request)


def refuse_unknown_fields(request: Any) -> None:
    """A field the request model does not know is refused by name (vLLM accepts and drops it,
    so a typo such as `temprature` silently samples at the default)."""
    extra = sorted(name for name in (request.model_extra or {}) if name != "best_of")
    if extra:
        _refuse(f"Unknown field `{extra[0]}`: it is not part of this endpoint's request body "
                "(check its spelling). Unknown fields are refused rather than ignored.", extra[0])


def check_completion(request: Any, *, enable_prompt_embeds: bool = False) -> None:
    """vLLM's completion-only checks, in its order, then the common refusals."""
    if request.thinking_token_budget not in (None, -1):
        _refuse("`thinking_token_budget` applies to chat completions (the reasoning parser "
                "reads the chat prompt); it is not supported on /v1/completions.",
                "thinking_token_budget")
    if request.echo and request.suffix is not None:
        _refuse("Echo is unsupported with suffix.", "echo")
    if request.echo and request.prompt_embeds is not None:
        _refuse("Echo is unsupported with prompt embeds.", "echo")
    if request.prompt_logprobs is not None and request.prompt_embeds is not None:
        _refuse("prompt_logprobs is not compatible with prompt embeds.", "prompt_logprobs")
    if request.prompt_embeds is not None and not enable_prompt_embeds:
        _refuse("You must set `--enable-prompt-embeds` to input `prompt_embeds`.", "prompt_embeds")
    if request.prompt_embeds is not None and request.use_beam_search:
        _refuse("Beam search is not supported with prompt embeds.", "prompt_embeds")
    if request.suffix is not None:
        _refuse("suffix is only supported for models with FIM completion rendering", "suffix")
    if request.use_beam_search and request.echo and request.logprobs is not None:
        _refuse("`echo` with `logprobs` is not supported with beam search because beam search "
                "does not compute prompt logprobs.", "echo")
    if request.use_beam_search and request.stream:
        _refuse("Streaming is not currently supported with beam search", "stream")
    check_common(request)


def check_chat(request: Any) -> None:
    """Chat-only refusals (multimodal kwargs), then the common ones. Tool-choice rules that
    depend on the server's parsers are in `chat_tools.ChatTools.check`."""
    for name in ("media_io_kwargs", "mm_processor_kwargs"):
        if getattr(request, name):
            _refuse(f"`{name}` is not supported: the served model is text-only.", name)
    check_common(request)
