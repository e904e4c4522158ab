"""`Trace`: where one request's time went, pipeline stages then engine phases.

Pipeline stages (check model, validate, preprocess, sampling params, prepare generators) come
from the serving pipeline's recorder; engine phases from `RequestOutput.metrics`: `queued`
(arrival -> first scheduled), `prefill` (-> first token), `decode` (-> finished). All times are
seconds relative to the first event. Times are run-dependent: the HTML prints each one as
`12.3 ms` inside `<span class="wb-time">`, and bar geometry as `NN.N%`, for notebook sanitizers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from workbench.display import html as h
from workbench.display.figure import neutral
from workbench.display.frames import frame

KIND_COLORS = {"pipeline": "#8fb8de", "engine": "#f0a868", "client": "#b0b0b0"}


@dataclass(frozen=True)
class Span:
    """One stage or phase: `kind` is "pipeline", "engine" or "client"."""

    name: str
    kind: str
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Trace:
    """Spans of one request, and the engine's step counts.

    >>> t = Trace((Span("validate", "pipeline", 0.0, 0.001), Span("decode", "engine", 0.001, 0.01)))
    >>> t["decode"].duration > 0, len(t)
    (True, 2)
    """

    spans: tuple[Span, ...]
    num_prefill_steps: int | None = None
    num_decode_steps: int | None = None
    num_cached_tokens: int | None = None  # prompt tokens found in the prefix cache
    num_shared_steps: int | None = None  # of its steps, those that ran other requests too
    max_step_requests: int | None = None  # the most requests one of its steps ran

    @classmethod
    def from_recorder(cls, recorder: Any) -> "Trace":
        """Pipeline stages plus the engine phases of the first prompt's request."""
        events = [(name, "pipeline", start, end) for name, start, end in recorder.stages]
        output = recorder.outputs.get(0)
        metrics = getattr(output, "metrics", None)
        events += _engine_events(metrics)
        if recorder.finished_at is not None and events:
            last = max(e[3] for e in events)
            events.append(("collect", "pipeline", min(last, recorder.finished_at),
                           recorder.finished_at))
        return cls._build(events, metrics, output)

    @classmethod
    def from_request_output(cls, output: Any) -> "Trace":
        """Engine phases only (an offline `LLM.generate` result)."""
        return cls._build(_engine_events(output.metrics), output.metrics, output)

    @classmethod
    def _build(cls, events: list[tuple[str, str, float, float]], metrics: Any,
               output: Any = None) -> "Trace":
        t0 = min((e[2] for e in events), default=0.0)
        spans = tuple(Span(n, k, s - t0, e - t0) for n, k, s, e in events)
        return cls(spans, getattr(metrics, "num_prefill_steps", None),
                   getattr(metrics, "num_decode_steps", None),
                   getattr(output, "num_cached_tokens", None),
                   getattr(metrics, "num_shared_steps", None),
                   getattr(metrics, "max_step_requests", None))

    def __getitem__(self, key: int | str) -> Span:
        if isinstance(key, int):
            return self.spans[key]
        for s in self.spans:
            if s.name == key:
                return s
        raise KeyError(key)

    def __len__(self) -> int:
        return len(self.spans)

    @property
    def total(self) -> float:
        return max((s.end for s in self.spans), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"spans": [asdict(s) for s in self.spans], "total": self.total,
                "num_prefill_steps": self.num_prefill_steps,
                "num_decode_steps": self.num_decode_steps,
                "num_cached_tokens": self.num_cached_tokens,
                "num_shared_steps": self.num_shared_steps,
                "max_step_requests": self.max_step_requests}

    def to_frame(self):
        return frame([{**asdict(s), "duration": s.duration} for s in self.spans],
                     ["name", "kind", "start", "end", "duration"])

    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self.spans)
        return f"Trace({len(self.spans)} spans: {names}; total {self.total * 1000:.1f} ms)"

    def _repr_html_(self) -> str:
        total = self.total or 1.0
        rows = []
        for s in self.spans:
            left, width = 100 * s.start / total, max(100 * s.duration / total, 0.5)
            bar = (f'<div style="position:relative;height:12px;width:300px;background:#f2f2f2">'
                   f'<div style="position:absolute;left:{left:.1f}%;width:{width:.1f}%;height:12px;'
                   f'background:{KIND_COLORS.get(s.kind, "#999999")}"></div></div>')
            rows.append((h.escape(s.kind), h.escape(s.name), bar, h.duration(s.duration)))
        steps = (f"prefill steps {self.num_prefill_steps}, decode steps {self.num_decode_steps}"
                 if self.num_prefill_steps is not None else "")
        if self.num_cached_tokens is not None:
            steps += f", cached prompt tokens {self.num_cached_tokens}"
        if self.num_shared_steps:
            steps += (f", {self.num_shared_steps} steps shared with other requests (up to "
                      f"{self.max_step_requests} requests in a step)")
        return h.themed(f'<div><div style="font-size:12px">Trace: {len(self.spans)} spans, total '
                        f'{h.duration(self.total)} {h.escape(steps)}</div>'
                        + h.table(["kind", "span", "timeline", "duration"], rows,
                                  escape_cells=False) + "</div>")

    def plot(self, ax: Any = None) -> Any:
        """The spans as a timeline (matplotlib, milliseconds); returns the axes."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 0.6 + 0.35 * max(len(self.spans), 1)))
        ax.barh(range(len(self.spans)), [1000 * s.duration for s in self.spans],
                left=[1000 * s.start for s in self.spans],
                color=[KIND_COLORS.get(s.kind, "#999999") for s in self.spans])
        ax.set_yticks(range(len(self.spans)), [f"{s.kind}: {s.name}" for s in self.spans],
                      fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("ms since the first span")
        ax.set_title(repr(self), fontsize=9)
        return neutral(ax)


def _engine_events(metrics: Any) -> list[tuple[str, str, float, float]]:
    if metrics is None:
        return []
    marks = [("queued", metrics.arrival_time, metrics.first_scheduled_time),
             ("prefill", metrics.first_scheduled_time, metrics.first_token_time),
             ("decode", metrics.first_token_time,
              metrics.finished_time or metrics.last_token_time)]
    return [(name, "engine", start, end) for name, start, end in marks
            if start is not None and end is not None]
