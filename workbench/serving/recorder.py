"""`PipelineRecorder`: what the serving pipeline checked, decided and when, for one request.

Every request through the serving pipeline gets one (`OpenAIServing.prepare` makes it unless
the caller passed its own in `RequestMeta.recorder`), so the checks it lists are the checks the server
ran, not a re-implementation. Each check is `passed`, `failed`, `coerced` (the server changed
the value: temperature raised to 0.01, max_tokens clamped, a default taken from the model's
generation_config) or `ignored` (accepted but without effect, or an unknown field). It also
keeps stage timings (`time.time()`, the engine's clock) and the last engine output per prompt,
from which `workbench.inspect` builds `ValidationReport` and `Trace`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from workbench.serving import unsupported
from workbench.serving.errors import error_response
from workbench.serving.sampling import NEUTRAL_DEFAULTS


@dataclass(frozen=True)
class Check:
    """One check: `status` is passed / failed / coerced / ignored."""

    name: str
    stage: str
    status: str
    param: str | None = None
    reason: str = ""
    value: Any = None


@dataclass
class PipelineRecorder:
    """Checks, stage timings and engine outputs of one request (filled by the pipeline)."""

    checks: list[Check] = field(default_factory=list)
    stages: list[tuple[str, float, float]] = field(default_factory=list)
    outputs: dict[int, Any] = field(default_factory=dict)  # prompt index -> last RequestOutput
    first_output_at: float | None = None
    finished_at: float | None = None
    error: Any = None  # the ErrorResponse, when a check failed

    def add(self, name: str, stage: str, status: str, param: str | None = None,
            reason: str = "", value: Any = None) -> None:
        self.checks.append(Check(name, stage, status, param, reason, value))

    @contextmanager
    def check(self, name: str, stage: str, param: str | None = None,
              passed: str = "") -> Iterator[None]:
        """Runs the body as one check: an exception fails it (and propagates)."""
        try:
            yield
        except Exception as exc:
            self.error = error_response(exc)
            self.add(name, stage, "failed", getattr(exc, "parameter", None) or param,
                     self.error.error.message, getattr(exc, "value", None))
            raise
        self.add(name, stage, "passed", param, passed)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            self.stages.append((name, start, time.time()))

    def output(self, index: int, output: Any) -> None:
        """Keeps the prompt's latest output; `first_output_at`: when the engine produced the
        first token of any of them (a non-streaming request's output arrives only at its end)."""
        first = engine_first_token_time(output) or time.time()
        if self.first_output_at is None or first < self.first_output_at:
            self.first_output_at = first
        self.outputs[index] = output

    # -- what the pipeline decided about fields ---------------------------------------------
    def fields(self, request: Any) -> None:
        """Each field the request set: honoured (passed) or ignored (`unsupported.IGNORED_FIELDS`,
        unknown extras)."""
        set_fields = request.model_fields_set
        beam = bool(getattr(request, "use_beam_search", False))
        no_effect = unsupported.no_effect_fields(request)
        for name in sorted(set_fields):
            value = getattr(request, name, None)
            if name in (request.model_extra or {}):
                continue  # unknown: listed below
            if name in unsupported.INSIDE_FIELDS and value not in (None, []) and not beam:
                continue  # listed as resolved with the sampling params (`inside_checks`)
            if name == "token_stats" and value and not beam:
                continue  # listed with the sampling params, where it applies (`token_stats_check`)
            if name in no_effect:
                self.add(name, "validate", "ignored", name, no_effect[name], value)
            elif beam and name in unsupported.BEAM_IGNORED_FIELDS and value is not None:
                self.add(name, "validate", "ignored", name,
                         unsupported.BEAM_IGNORED_FIELDS[name], value)
            elif name == "prompt_embeds" and value is not None:  # megabytes: sizes only
                payloads = value if isinstance(value, list) else [value]
                self.add(name, "validate", "passed", name, "honoured",
                         {"base64_chars": [len(p) if isinstance(p, str) else None
                                           for p in payloads]})
            elif name not in ("model", "prompt", "messages"):
                self.add(name, "validate", "passed", name, "honoured", value)
        for name, value in (request.model_extra or {}).items():
            if value is not None:
                self.add(name, "validate", "ignored", name,
                         "unknown field: not part of this endpoint's request model", value)

    def coercions(self, request: Any, params: Any, defaults: dict[str, Any],
                  max_tokens_param: str, requested_max: int | None, prompt_len: int,
                  max_model_len: int) -> None:
        """Values the server changed or filled in, compared with what the request asked."""
        for name in NEUTRAL_DEFAULTS:
            value = getattr(request, name, None)
            if value is None and name in defaults:
                self.add(name, "sampling params", "coerced", name,
                         f"not set: taken from the model's generation_config ({defaults[name]})",
                         defaults[name])
        temperature = getattr(request, "temperature", None)
        if temperature is not None and params.temperature != temperature and temperature > 0:
            self.add("temperature", "sampling params", "coerced", "temperature",
                     f"raised from {temperature} to {params.temperature} (minimum positive "
                     "temperature)", params.temperature)
        if params.max_tokens != requested_max:
            room = max_model_len - prompt_len
            if requested_max is None:
                why = "not set: the room left in the context"
            elif params.max_tokens == room:
                why = f"clamped to the context: {max_model_len} - {prompt_len} prompt tokens"
            elif params.max_tokens == defaults.get("max_tokens"):
                why = "clamped to the model's generation_config max_new_tokens"
            else:
                why = "echo only: one token generated, then dropped"
            self.add(max_tokens_param, "sampling params", "coerced", max_tokens_param,
                     f"{requested_max} -> {params.max_tokens}: {why}", params.max_tokens)
        added = [t for t in defaults.get("stop_token_ids") or []
                 if t not in (getattr(request, "stop_token_ids", None) or [])]
        if added:
            self.add("stop_token_ids", "sampling params", "coerced", "stop_token_ids",
                     f"the model's generation_config adds {added}", params.stop_token_ids)


def engine_first_token_time(output: Any) -> float | None:
    """When the engine produced `output`'s first token (`time.time()`), if it says."""
    return getattr(getattr(output, "metrics", None), "first_token_time", None)
