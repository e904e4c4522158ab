"""`ValidationReport`: every check the serving pipeline ran for one request, and its verdict.

Each row is a `Check` recorded by the real pipeline (`workbench/serving/recorder.py`): the
request schema, the model name, refused fields, each field the request set (honoured or
ignored), the prompt (chat template, tokenization, input length), the sampling parameters,
coercions (temperature raised to 0.01, max_tokens clamped to the context, defaults from the
model's generation_config), what the request sees and changes inside the model, resolved
against it (`capture`: the full names recorded and the positions; `logit_lens`: its layers and
top-k; one `interventions[i]` row each: site, op, positions), `token_stats` with the positions
it applies to (generated, prompt) and, in a dry run, the engine's
own input checks. `error` is the
error envelope the server returns for this request (None when it would be served).

`validate(servings, body)` is the dry run: it parses the body as the HTTP route does and
runs the pipeline up to scheduling, generating nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import pydantic

from workbench.display import html as h
from workbench.display.figure import neutral
from workbench.display.frames import frame
from workbench.serving.base import RequestMeta
from workbench.serving.errors import error_response, validation_error_body
from workbench.serving.protocol import ChatCompletionRequest, CompletionRequest
from workbench.serving.recorder import Check, PipelineRecorder

STATUSES = ("passed", "failed", "coerced", "ignored")
_COLORS = {"passed": "#d8f0d8", "failed": "#f6d0d0", "coerced": "#fbeec8", "ignored": "#e4e4e4"}


@dataclass(frozen=True)
class ValidationReport:
    """The checks of one request, in the order they ran.

    >>> from workbench.serving.recorder import Check
    >>> report = ValidationReport("completions", (Check("model", "check model", "passed"),
    ...                                           Check("user", "validate", "ignored", "user")))
    >>> report.ok, [c.name for c in report.ignored]
    (True, ['user'])
    >>> report
    ValidationReport(completions: ok, 1 passed, 0 failed, 0 coerced, 1 ignored)
    """

    endpoint: str
    checks: tuple[Check, ...]
    error: dict[str, Any] | None = None  # {"error": {message, type, param, code}}

    @classmethod
    def from_recorder(cls, recorder: PipelineRecorder, endpoint: str) -> "ValidationReport":
        error = recorder.error.model_dump() if recorder.error is not None else None
        return cls(endpoint, tuple(recorder.checks), error)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ValidationReport":
        """The inverse of `to_dict` (what `POST /v1/validate` returns)."""
        checks = tuple(Check(**{k: c.get(k) for k in ("name", "stage", "status", "param",
                                                         "reason", "value")})
                       for c in data.get("checks", []))
        return cls(data.get("endpoint", ""), checks, data.get("error"))

    # -- access -----------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def status_code(self) -> int:
        return 200 if self.error is None else self.error["error"]["code"]

    def _with(self, status: str) -> list[Check]:
        return [c for c in self.checks if c.status == status]

    @property
    def passed(self) -> list[Check]:
        return self._with("passed")

    @property
    def failed(self) -> list[Check]:
        return self._with("failed")

    @property
    def coerced(self) -> list[Check]:
        return self._with("coerced")

    @property
    def ignored(self) -> list[Check]:
        return self._with("ignored")

    def __getitem__(self, key: int | str) -> Check:
        """By position, or the first check with that name or parameter."""
        if isinstance(key, int):
            return self.checks[key]
        for c in self.checks:
            if key in (c.name, c.param):
                return c
        raise KeyError(key)

    def __len__(self) -> int:
        return len(self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "ok": self.ok, "status_code": self.status_code,
                "checks": [{**asdict(c), "value": _jsonable(c.value)} for c in self.checks],
                "error": self.error}

    def to_frame(self):
        return frame([asdict(c) for c in self.checks],
                     ["name", "stage", "status", "param", "reason", "value"],
                     {"param": "string", "reason": "string", "value": "object"})

    def __repr__(self) -> str:
        verdict = "ok" if self.ok else f"error {self.status_code}"
        counts = ", ".join(f"{len(self._with(s))} {s}" for s in STATUSES)
        return f"ValidationReport({self.endpoint}: {verdict}, {counts})"

    def _repr_html_(self) -> str:
        rows = []
        for c in self.checks:
            badge = (f'<span style="{h.on(_COLORS.get(c.status, "#ffffff"))};padding:0 4px">'
                     f"{h.escape(c.status)}</span>")
            rows.append((h.escape(c.stage), h.escape(c.name), badge,
                         h.escape(c.param or ""), h.escape(c.reason)))
        parts = [f'<div style="font-size:12px">{h.escape(repr(self))}</div>',
                 h.table(["stage", "check", "status", "param", "reason"], rows,
                         escape_cells=False)]
        if self.error is not None:
            err = self.error["error"]
            parts.append(h.error_box(f'{h.escape(err["code"])} {h.escape(err["type"])} (param '
                                     f'{h.escape(err.get("param"))}): '
                                     f'{h.escape(err["message"])}'))
        return h.themed(f'<div id="{h.content_id("wb-validation", self.to_dict())}">'
                        + "".join(parts) + "</div>")

    def plot(self, ax: Any = None) -> Any:
        """The number of checks per status (matplotlib bars); returns the axes."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib

        if ax is None:
            _, ax = plt.subplots(figsize=(5, 2.5))
        ax.barh(STATUSES, [len(self._with(s)) for s in STATUSES],
                color=[_COLORS[s] for s in STATUSES], edgecolor="#444444", linewidth=0.5)
        ax.invert_yaxis()
        ax.set_xlabel("checks")
        ax.set_title(repr(self), fontsize=9)
        return neutral(ax)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def endpoint_of(body: dict[str, Any]) -> str:
    """"chat" for a body with messages, else "completions"."""
    return "chat" if "messages" in body else "completions"


def parse(body: dict[str, Any], endpoint: str | None = None
          ) -> tuple[Any, PipelineRecorder, str]:
    """The body as the HTTP route parses it: (request model or None, recorder, endpoint)."""
    endpoint = endpoint or endpoint_of(body)
    model = ChatCompletionRequest if endpoint == "chat" else CompletionRequest
    rec = PipelineRecorder()
    try:
        request = model.model_validate(body)
    except pydantic.ValidationError as exc:  # as FastAPI reports a body: locations under "body"
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        error = validation_error_body(errors)
        rec.add("request schema", "parse", "failed", error["error"]["param"],
                error["error"]["message"])
        rec.error = _Envelope(error)
        return None, rec, endpoint
    rec.add("request schema", "parse", "passed", None, "the body parses as the request model")
    return request, rec, endpoint


@dataclass(frozen=True)
class _Envelope:
    """An error body already in JSON form, standing in for an `ErrorResponse`."""

    body: dict[str, Any]

    def model_dump(self) -> dict[str, Any]:
        return self.body


def validate(servings: Any, body: dict[str, Any], endpoint: str | None = None,
             headers: dict[str, str] | None = None) -> ValidationReport:
    """Dry run: parse `body` as the HTTP route does, then the pipeline up to scheduling."""
    request, rec, endpoint = parse(body, endpoint)
    if request is None:
        return ValidationReport.from_recorder(rec, endpoint)
    serving = servings.chat if endpoint == "chat" else servings.completions
    meta = RequestMeta(headers={k.lower(): v for k, v in (headers or {}).items()}, recorder=rec)
    try:
        serving.prepare(request, meta, schedule=False)
    except Exception as exc:  # noqa: BLE001 - the failing check recorded the envelope
        if rec.error is None:
            rec.error = error_response(exc)
    return ValidationReport.from_recorder(rec, endpoint)
