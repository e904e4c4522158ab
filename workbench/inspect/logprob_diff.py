"""`LogprobDiff`: two `LogprobTable`s of the same prompt side by side, position by position.

Made for "what does this change do to the model": base vs LoRA adapter (`Workbench.compare_lora`),
two temperatures, two servers. Row i pairs position i of both tables: their chosen tokens and
logprobs, and, where the other side's token is among this side's returned alternatives, what
this side thought of it (`a_logprob_of_b`, `b_logprob_of_a`). Both runs see the same context
only up to the first position where their tokens differ (`diverged_at`); rows after it compare
different prefixes and are marked so.

>>> from workbench.inspect.logprob_table import Alternative, LogprobRow, LogprobTable
>>> a = LogprobTable((LogprobRow(0, "Hi", -0.1, 1, None, (Alternative("Hi", -0.1, 1),
...                                                        Alternative("Ahoy", -3.0, 2))),))
>>> b = LogprobTable((LogprobRow(0, "Ahoy", -0.2, 1, None, (Alternative("Ahoy", -0.2, 1),)),))
>>> d = a.diff(b)
>>> d.diverged_at, d[0].a_logprob_of_b
(0, -3.0)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from workbench.display import html as h
from workbench.display.figure import neutral
from workbench.display.frames import frame


@dataclass(frozen=True)
class DiffRow:
    position: int
    a_token: str | None
    a_logprob: float | None
    b_token: str | None
    b_logprob: float | None
    a_logprob_of_b: float | None = None  # side a's logprob of b's token (if in a's top-k)
    b_logprob_of_a: float | None = None
    same_context: bool = True  # both sides saw the same tokens before this position

    @property
    def same(self) -> bool:
        return self.a_token == self.b_token

    @property
    def delta(self) -> float | None:
        """b's logprob minus a's, for the same token in the same context."""
        if not (self.same and self.same_context) or None in (self.a_logprob, self.b_logprob):
            return None
        return self.b_logprob - self.a_logprob

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "same": self.same, "delta": self.delta}


def _logprob_of(row: Any, token: str | None) -> float | None:
    if row is None or token is None:
        return None
    if row.token == token:
        return row.logprob
    return next((alt.logprob for alt in row.top if alt.token == token), None)


@dataclass(frozen=True)
class LogprobDiff:
    """Position-by-position comparison of two tables (see the module docstring)."""

    rows: tuple[DiffRow, ...]
    a_name: str = "a"
    b_name: str = "b"

    @classmethod
    def of(cls, a: Any, b: Any, a_name: str = "a", b_name: str = "b") -> "LogprobDiff":
        rows, same_context = [], True
        for i in range(max(len(a), len(b))):
            ra = a.rows[i] if i < len(a) else None
            rb = b.rows[i] if i < len(b) else None
            ta, tb = getattr(ra, "token", None), getattr(rb, "token", None)
            rows.append(DiffRow(i, ta, getattr(ra, "logprob", None), tb,
                                getattr(rb, "logprob", None), _logprob_of(ra, tb),
                                _logprob_of(rb, ta), same_context))
            same_context = same_context and ta == tb
        return cls(tuple(rows), a_name, b_name)

    def __getitem__(self, position: int) -> DiffRow:
        return self.rows[position]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def diverged_at(self) -> int | None:
        """The first position whose tokens differ (None: identical)."""
        return next((r.position for r in self.rows if not r.same), None)

    def to_dict(self) -> dict[str, Any]:
        return {"a_name": self.a_name, "b_name": self.b_name, "diverged_at": self.diverged_at,
                "rows": [r.to_dict() for r in self.rows]}

    def to_frame(self):
        columns = [*DiffRow.__dataclass_fields__, "same", "delta"]
        return frame([r.to_dict() for r in self.rows], columns).set_index("position")

    def __repr__(self) -> str:
        where = "identical" if self.diverged_at is None else f"diverge at {self.diverged_at}"
        return f"LogprobDiff({self.a_name} vs {self.b_name}: {len(self.rows)} positions, {where})"

    def _repr_html_(self) -> str:
        a, b = self.a_name, self.b_name
        rows = []
        for r in self.rows:
            style = "" if r.same else "font-weight:bold;"
            mark = "" if r.same_context else " ·"
            rows.append([
                f"{r.position}{mark}",
                f'<span style="{style}white-space:pre">{_token(r.a_token)}</span>',
                h.fmt(r.a_logprob),
                f'<span style="{style}white-space:pre">{_token(r.b_token)}</span>',
                h.fmt(r.b_logprob), h.fmt(r.a_logprob_of_b), h.fmt(r.delta)])
        headers = ["pos", f"{a} token", f"{a} logprob", f"{b} token", f"{b} logprob",
                   f"{a} logprob of {b}'s token", "delta"]
        div_id = h.content_id("wb-logprob-diff", self.to_dict())
        note = ("· = after the first difference: the two sides continue different texts")
        return (f'<div id="{div_id}">{h.caption(h.escape(repr(self)) + "; " + h.escape(note))}'
                f"{h.table(headers, rows, escape_cells=False)}</div>")

    def plot(self, ax: Any = None) -> Any:
        """Each side's logprob per position (matplotlib), the first difference marked; returns
        the axes."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 3))
        nan = float("nan")
        positions = [r.position for r in self.rows]
        for name, values, marker in ((self.a_name, [r.a_logprob for r in self.rows], "o"),
                                     (self.b_name, [r.b_logprob for r in self.rows], "x")):
            ax.plot(positions, [nan if v is None else v for v in values], marker=marker,
                    label=name)
        if self.diverged_at is not None:
            ax.axvline(self.diverged_at, color="#c62828", ls="--", label="first difference")
        ax.set_xlabel("position")
        ax.set_ylabel("logprob of the chosen token")
        ax.legend(fontsize=8)
        ax.set_title(repr(self), fontsize=9)
        return neutral(ax)


def _token(token: str | None) -> str:
    """A token as visible marks with the raw token on hover; a missing one as an em dash."""
    return "—" if token is None else h.token_html(token)
