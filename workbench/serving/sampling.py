"""Request fields -> `SamplingParams`: the defaults chain and the max-tokens rule.

Defaults (reference §2.2): the request's value, else the model's generation config
(`engine.generation_defaults`), else the neutral value. Max tokens: `min(max_model_len -
prompt_len, requested, generation-config max_new_tokens)`; a request asking for more than
`max_model_len` is refused, one that merely overflows the context is clamped.
"""

from __future__ import annotations

from typing import Any

from workbench.errors import ValidationError
from workbench.sampling_params import RequestOutputKind, SamplingParams
from workbench.serving.structured import structured_outputs_from_request

NEUTRAL_DEFAULTS = {
    "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
    "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
}
_ALIASES = {"max_new_tokens": "max_tokens"}


def server_defaults(generation_defaults: dict[str, Any] | None) -> dict[str, Any]:
    """The model's generation config, in request field names (`max_new_tokens` -> `max_tokens`)."""
    defaults = {}
    for key, value in (generation_defaults or {}).items():
        key = _ALIASES.get(key, key)
        if key in NEUTRAL_DEFAULTS or key in ("max_tokens", "stop_token_ids"):
            defaults[key] = value
    return defaults


def resolve_max_tokens(requested: int | None, parameter: str, prompt_len: int,
                       max_model_len: int, defaults: dict[str, Any]) -> int:
    if requested is not None and requested > max_model_len:
        raise ValidationError(f"{parameter}={requested} cannot be greater than max_model_len="
                              f"{max_model_len}. Please request fewer output tokens.",
                              parameter=parameter, value=requested)
    candidates = (max_model_len - prompt_len, requested, defaults.get("max_tokens"))
    return min(v for v in candidates if v is not None)


def build_sampling_params(request: Any, *, max_tokens: int, logprobs: int | None,
                          prompt_logprobs: int | None, defaults: dict[str, Any]) -> SamplingParams:
    """The fields both endpoints share; `logprobs`/`prompt_logprobs` come resolved per endpoint."""
    values = {
        name: getattr(request, name) if getattr(request, name) is not None
        else defaults.get(name, neutral)
        for name, neutral in NEUTRAL_DEFAULTS.items()
    }
    stop_token_ids = list(request.stop_token_ids or [])
    for token_id in defaults.get("stop_token_ids") or []:
        if token_id not in stop_token_ids:
            stop_token_ids.append(token_id)
    n = request.n if request.n is not None else 1
    if getattr(request, "use_beam_search", False):
        n = 1  # beam search reads its width from the request; the greedy n-check is not its
    return SamplingParams(
        n=n, **values, seed=request.seed,
        stop=request.stop, stop_token_ids=stop_token_ids, ignore_eos=request.ignore_eos,
        max_tokens=max_tokens, min_tokens=request.min_tokens, logprobs=logprobs,
        logprob_token_ids=request.logprob_token_ids or None, prompt_logprobs=prompt_logprobs,
        skip_special_tokens=request.skip_special_tokens,
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        logit_bias=request.logit_bias, allowed_token_ids=request.allowed_token_ids,
        bad_words=request.bad_words, truncate_prompt_tokens=request.truncate_prompt_tokens,
        # a non-streaming response needs only the final output (vLLM's choice too): no
        # per-step outputs to hand to the event loop, merge and drop
        output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
        structured_outputs=structured_outputs_from_request(request),
        # inside the model (`workbench.inside.spec`): parsed here, resolved by the pipeline
        capture=request.capture, logit_lens=request.logit_lens,
        interventions=request.interventions, features=request.features,
        # the whole distribution at each position with logprobs (checked by SamplingParams)
        token_stats=False if request.token_stats is None else request.token_stats,
    )
