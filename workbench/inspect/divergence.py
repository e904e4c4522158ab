"""`DivergenceReport`: does the same request give the same bits alone, batched, and cached?

One reproducible request (greedy, or seeded) run in several scenarios (`Workbench.replay`,
`workbench/verbs/replay.py`): `alone` first, the reference; `batch`, in the same engine
steps as other requests of other prompts and lengths; `warm`, right after the reference with
its prompt in the prefix cache. Each scenario's generated tokens (`RunTokens`: ids, logprobs,
the returned alternatives, the top-2 margin) are compared with the reference's (`Divergence`):

- `logprob_diverges_at`: the first position whose logprobs are not bit-equal (the chosen
  token's, or any alternative both runs returned), or whose tokens differ;
- `token_diverges_at`: the first position whose tokens differ (a run that stops earlier
  diverges where it stops);
- `deltas`: per position before the token divergence (the contexts are the same there), the
  largest |Δ logprob| over the chosen token and the alternatives both returned; `max_delta`;
- at the token divergence, the reference's top-2 `margin` (the engine's exact one with
  `token_stats`, else the gap between the two best returned logprobs) and `near_tie`: the
  margin is below `tie` (0.01 nats unless told), or below twice `max_delta` (logprob noise
  of that size moves each of the two best tokens by up to that much, so their order can swap).
  A divergence that is not a near-tie is more than rounding noise. Under seeded sampling the
  margin still says how close the two best were; a sampled draw can flip elsewhere.

>>> ref = RunTokens((1, 2, 3), ("a", "b", "c"), (-0.1, -0.2, -0.3), margins=(2.0, 0.004, 1.0))
>>> other = RunTokens((1, 4, 5), ("a", "d", "e"), (-0.1, -0.6, -0.2))
>>> d = compare(ref, other, "batch")
>>> d.logprob_diverges_at, d.token_diverges_at, d.max_delta, d.near_tie
(1, 1, 0.0, True)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from workbench.display import html as h
from workbench.display.figure import GREY, neutral
from workbench.display.frames import frame
from workbench.inspect.logprob_table import LogprobTable

__all__ = ["DivergenceReport", "Divergence", "RunTokens", "Scenario", "compare"]

TIE = 0.01  # nats: a top-2 margin below this is a near-tie whatever the noise
Pairs = tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class RunTokens:
    """One run's generated tokens: the ids compared (texts where the body had no ids), their
    texts, logprobs, the alternatives returned per position ((token, logprob), best first) and
    the top-2 margin per position (None: unknown)."""

    token_ids: tuple[Any, ...]
    tokens: tuple[str, ...]
    logprobs: tuple[float | None, ...]
    top: tuple[Pairs, ...] = ()
    margins: tuple[float | None, ...] = ()

    def __len__(self) -> int:
        return len(self.token_ids)

    @classmethod
    def of(cls, response: dict[str, Any], choice: int = 0) -> "RunTokens":
        """Choice `choice` of a completions or chat body asked with logprobs (and, for exact
        comparison, `return_token_ids`)."""
        table = LogprobTable.from_response(response, choice)
        found = [c for c in response.get("choices") or [] if c.get("index", 0) == choice]
        ids = (found[0].get("token_ids") if found else None) or [r.token for r in table.rows]
        top = tuple(tuple((a.token, a.logprob) for a in r.top) for r in table.rows)
        margins = tuple(r.margin if r.margin is not None else _margin(pairs)
                        for r, pairs in zip(table.rows, top))
        return cls(tuple(ids), tuple(table.tokens), tuple(table.logprobs), top, margins)

    def pairs(self, k: int) -> dict[str, float]:
        return dict(self.top[k]) if k < len(self.top) else {}

    def margin(self, k: int) -> float | None:
        return self.margins[k] if k < len(self.margins) else None


def _margin(pairs: Pairs) -> float | None:
    """The gap between the two best returned logprobs (None with fewer than two)."""
    best = sorted((lp for _, lp in pairs), reverse=True)
    return best[0] - best[1] if len(best) > 1 else None


def _delta(a: RunTokens, b: RunTokens, k: int) -> float | None:
    """The largest |Δ logprob| at position `k` over the chosen token (the same in both) and
    the alternatives both returned; None when nothing there is comparable."""
    pair = [(a.logprobs[k], b.logprobs[k])] if k < min(len(a.logprobs), len(b.logprobs)) else []
    diffs = [abs(x - y) for x, y in pair if x is not None and y is not None]
    theirs = b.pairs(k)
    diffs += [abs(lp - theirs[t]) for t, lp in a.pairs(k).items() if t in theirs]
    return max(diffs) if diffs else None


@dataclass(frozen=True)
class Divergence:
    """One scenario against the reference (see the module docstring)."""

    scenario: str
    token_diverges_at: int | None
    logprob_diverges_at: int | None
    deltas: tuple[float | None, ...]  # per position before the token divergence
    margin: float | None = None  # the reference's top-2 margin at the token divergence
    near_tie: bool | None = None  # None: no token divergence, or no margin known
    reference_token: str | None = None  # the two tokens at the token divergence
    token: str | None = None
    tie: float = TIE

    @property
    def identical(self) -> bool:
        """The same tokens, and every logprob compared bit-equal."""
        return self.token_diverges_at is None and self.logprob_diverges_at is None

    @property
    def max_delta(self) -> float:
        """The largest |Δ logprob| before the token divergence (0.0: bit-equal there)."""
        return max((d for d in self.deltas if d is not None), default=0.0)

    @property
    def verdict(self) -> str:
        if self.identical:
            return "identical"
        if self.token_diverges_at is None:
            return "logprobs differ"
        return "tokens differ (near-tie)" if self.near_tie else "tokens differ"

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "identical": self.identical, "verdict": self.verdict,
                "token_diverges_at": self.token_diverges_at,
                "logprob_diverges_at": self.logprob_diverges_at, "max_delta": self.max_delta,
                "margin": self.margin, "near_tie": self.near_tie, "tie": self.tie,
                "reference_token": self.reference_token, "token": self.token,
                "deltas": list(self.deltas)}


def compare(reference: RunTokens, other: RunTokens, scenario: str = "other",
            tie: float = TIE) -> Divergence:
    """`other` against `reference`, position by position (see the module docstring)."""
    shared = min(len(reference), len(other))
    at = next((k for k in range(shared) if reference.token_ids[k] != other.token_ids[k]),
              None if len(reference) == len(other) else shared)
    deltas = tuple(_delta(reference, other, k) for k in range(shared if at is None else at))
    moved = next((k for k, d in enumerate(deltas) if d), None)
    logprob_at = moved if moved is not None else at
    if at is None:
        return Divergence(scenario, None, logprob_at, deltas, tie=tie)
    margin = reference.margin(at)
    noise = max((d for d in deltas if d is not None), default=0.0)
    near = None if margin is None else bool(margin < tie or margin < 2 * noise)
    text = (lambda run: run.tokens[at] if at < len(run.tokens) else None)  # noqa: E731
    return Divergence(scenario, at, logprob_at, deltas, margin, near, text(reference),
                      text(other), tie)


@dataclass(frozen=True)
class Scenario:
    """One run of the request: its name, tokens, and what the server said of how it ran
    (None: not reported): prompt tokens served from the prefix cache, steps shared with other
    requests and the most requests in one of its steps (our engine's counts); `others`: how
    many other requests were sent with it. `result`: the `Result` (or body) it came from."""

    name: str
    tokens: RunTokens
    text: str | None = None
    num_cached_tokens: int | None = None
    num_shared_steps: int | None = None
    max_step_requests: int | None = None
    others: int = 0
    result: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "text": self.text, "tokens": list(self.tokens.tokens),
                "token_ids": list(self.tokens.token_ids), "logprobs": list(self.tokens.logprobs),
                "num_cached_tokens": self.num_cached_tokens,
                "num_shared_steps": self.num_shared_steps,
                "max_step_requests": self.max_step_requests, "others": self.others}


# a row's background by verdict: the same light palette as the other views (dark: `h.themed`)
VERDICT_COLOURS = {"identical": "#d9f2d9", "logprobs differ": "#fff4c2",
                   "tokens differ (near-tie)": "#ffe2bf", "tokens differ": "#f9d0d0"}


class DivergenceReport:
    """The reference run and every other scenario compared with it (module docstring).

    >>> ref = Scenario("alone", RunTokens((1, 2), ("a", "b"), (-0.1, -0.2)))
    >>> report = DivergenceReport(ref, [Scenario("warm", ref.tokens)])
    >>> report.identical, report["warm"].verdict
    (True, 'identical')
    """

    def __init__(self, reference: Scenario, scenarios: list[Scenario], tie: float = TIE,
                 where: str = "", request: dict[str, Any] | None = None):
        self.reference = reference
        self.scenarios = list(scenarios)
        self.tie = tie
        self.where = where  # "in-kernel engine" or the server's URL
        self.request = request  # the body replayed (with what the comparison forced)
        self.divergences = [compare(reference.tokens, s.tokens, s.name, tie) for s in scenarios]

    def __getitem__(self, key: int | str) -> Divergence:
        if isinstance(key, int):
            return self.divergences[key]
        for d in self.divergences:
            if d.scenario == key:
                return d
        raise KeyError(f"no scenario {key!r}: the report has "
                       f"{[s.name for s in self.scenarios]}")

    def __len__(self) -> int:
        return len(self.divergences)

    def __iter__(self) -> Iterator[Divergence]:
        return iter(self.divergences)

    @property
    def identical(self) -> bool:
        """Every scenario gave the reference's bits."""
        return all(d.identical for d in self.divergences)

    def __repr__(self) -> str:
        parts = [f"{d.scenario}: {d.verdict}" + (
            f" at {d.token_diverges_at}" if d.token_diverges_at is not None else
            f" from {d.logprob_diverges_at}" if d.logprob_diverges_at is not None else "")
            for d in self.divergences]
        return (f"DivergenceReport({len(self.reference.tokens)} tokens vs {self.reference.name}; "
                f"{', '.join(parts)})")

    # -- the protocol ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"where": self.where, "tie": self.tie, "identical": self.identical,
                "request": self.request, "reference": self.reference.to_dict(),
                "scenarios": [{**s.to_dict(), **d.to_dict()}
                              for s, d in zip(self.scenarios, self.divergences)]}

    _COLUMNS = ["scenario", "verdict", "identical", "token_diverges_at", "logprob_diverges_at",
                "max_delta", "margin", "near_tie", "reference_token", "token",
                "num_cached_tokens", "num_shared_steps", "max_step_requests", "others", "text"]

    def to_frame(self):
        """One row per scenario against the reference (the reference's own row first)."""
        ref = self.reference
        records = [{"scenario": ref.name, "verdict": "reference", "text": ref.text,
                    "num_cached_tokens": ref.num_cached_tokens,
                    "num_shared_steps": ref.num_shared_steps,
                    "max_step_requests": ref.max_step_requests, "others": ref.others}]
        for s, d in zip(self.scenarios, self.divergences):
            records.append({**d.to_dict(), **{k: v for k, v in s.to_dict().items()
                                              if k.startswith(("num_", "max_", "others"))},
                            "text": s.text})
        return frame(records, self._COLUMNS, {
            **dict.fromkeys(["token_diverges_at", "logprob_diverges_at", "num_cached_tokens",
                             "num_shared_steps", "max_step_requests", "others"], "Int64"),
            "max_delta": "Float64", "margin": "Float64", "near_tie": "boolean",
            "identical": "boolean"})

    def deltas_frame(self):
        """One row per scenario and position before its token divergence: |Δ logprob|."""
        records = [{"scenario": d.scenario, "position": k, "delta": delta}
                   for d in self.divergences for k, delta in enumerate(d.deltas)]
        return frame(records, ["scenario", "position", "delta"],
                     {"position": "Int64", "delta": "Float64"})

    def plot(self, ax: Any = None) -> Any:
        """|Δ logprob| per position for each scenario (log scale, bit-equal positions on the
        axis), each token divergence a dashed line; returns the Axes."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 3))
        nonzero = [x for d in self.divergences for x in d.deltas if x]
        floor = min(nonzero) / 10 if nonzero else 1e-9
        for i, d in enumerate(self.divergences):
            colour = f"C{i % 10}"
            xs = [k for k, x in enumerate(d.deltas) if x is not None]
            ax.plot(xs, [d.deltas[k] or floor for k in xs], marker="o", ms=3, color=colour,
                    label=f"{d.scenario}: {d.verdict}")
            if d.token_diverges_at is not None:
                ax.axvline(d.token_diverges_at, color=colour, ls="--", lw=1)
        ax.axhline(floor, color=GREY, ls=":", lw=0.8)  # where bit-equal positions sit
        ax.set_ylim(floor / 2, 2 * max(nonzero, default=10 * floor))  # never a single value
        ax.set_yscale("log")
        ax.set_xlabel("generated position")
        ax.set_ylabel(f"|Δ logprob| vs {self.reference.name}")
        ax.set_title(f"bit-equal positions drawn at {floor:.0e}; dashed: tokens differ",
                     fontsize=9)
        if ax.lines:
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        return neutral(ax)

    def _repr_html_(self) -> str:
        ref = self.reference
        rows = [(h.escape(ref.name), "reference", "—", "—", "—", "—", "—",
                 *_counts(ref), h.clip_words(ref.text or ""))]
        for s, d in zip(self.scenarios, self.divergences):
            verdict = (f'<span style="{h.on(VERDICT_COLOURS[d.verdict])};padding:0 4px">'
                       f"{h.escape(d.verdict)}</span>")
            tokens = ("—" if d.token_diverges_at is None else
                      f"{_tok(d.reference_token)} → {_tok(d.token)}")
            rows.append((h.escape(s.name), verdict, _int(d.logprob_diverges_at),
                         _int(d.token_diverges_at), tokens, _sci(d.max_delta),
                         h.fmt(d.margin), *_counts(s), h.clip_words(s.text or "")))
        headers = ["scenario", "verdict", "logprobs differ from", "tokens differ at",
                   "reference → this token", "max |Δ logprob| before", "reference margin there",
                   "cached prompt tokens", "steps shared", "others sent", "text"]
        note = (f"near-tie: the reference's top-2 margin at the token divergence is below "
                f"{self.tie:g} nats or below twice the max |Δ logprob| before it")
        where = f" on {self.where}" if self.where else ""
        summary = (f"{len(ref.tokens)} tokens{where}: "
                   + ("every scenario bit-identical to the reference" if self.identical
                      else "some scenario diverges from the reference"))
        data = {k: v for k, v in self.to_dict().items() if k != "where"}  # not the port
        div_id = h.content_id("wb-divergence", data)
        return h.themed(
            f'<div id="{div_id}" class="wb-divergence" style="font-size:12px">'
            f'<div class="wb-summary">{h.escape(summary)}</div>'
            f"{h.swatches(list(VERDICT_COLOURS.items()), 'verdict:')}"
            f"{h.table(headers, rows, escape_cells=False)}{h.caption(h.escape(note))}</div>")


def _int(value: int | None) -> str:
    return "—" if value is None else str(value)


def _sci(value: float) -> str:
    """|Δ| in a fixed scientific format (0 as 0: bit-equal)."""
    return "0" if value == 0 else f"{value:.2e}"


def _tok(token: str | None) -> str:
    return h.EMPTY_TOKEN if token is None else h.token_html(token)


def _counts(s: Scenario) -> tuple[str, str, str]:
    shared = ("—" if s.num_shared_steps is None else
              f"{s.num_shared_steps} (up to {s.max_step_requests} requests)"
              if s.num_shared_steps else "0")
    return _int(s.num_cached_tokens), h.escape(shared), str(s.others)
