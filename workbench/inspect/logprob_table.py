"""`LogprobTable`: per position, the token, its logprob, rank, top-k alternatives and entropy.

Built from whatever a generation returns: our engine's `RequestOutput`, or the body of a
`/v1/completions` (legacy `logprobs`: tokens / token_logprobs / top_logprobs, and vLLM's
`prompt_logprobs`) or `/v1/chat/completions` (`logprobs.content[...]`) response, as a dict,
our pydantic model or the `openai` client's object, from this server or any OpenAI-compatible
one (vLLM). Rows are plain dataclasses; `table[i]` is the i-th generated position,
`table.prompt` the prompt positions (when the response has them).

Structured outputs: rows built from an engine output whose sample carries `grammar_steps` say
how many tokens the grammar allowed there (`allowed`), which of the model's top candidates it
masked (`masked`, raw logprobs; those among `top` have `masked=True`), and whether it overruled
the model (`overruled`: a masked token was more likely than the chosen one).

Entropy, and which one a row has (`entropy_kind`): with `token_stats` (our engine, or a
workbench server's `token_stats` / `prompt_token_stats` keys) each row carries the engine's
`TokenStats`, and `entropy` is that of the whole vocabulary's distribution ("full"), `rank` the
token's rank over the whole vocabulary, `margin` the top-2 logprob gap and `top_mass` the mass
of the returned top-k, all exact. Without them (a vLLM server, a request that did not ask)
`entropy` is computed over the alternatives the source returned (the top-k, plus the chosen
token when it is outside them), *renormalised* to sum to one ("top-k"): a lower bound on
nothing in particular, but comparable across positions of one table; `top_mass` then says how
much of the distribution those alternatives hold, and `margin` is unknown.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from workbench.display import html as h
from workbench.display.figure import neutral
from workbench.display.frames import frame
from workbench.engine.requests.outputs import TokenStats
from workbench.inspect.logprob_diff import LogprobDiff


@dataclass(frozen=True)
class Alternative:
    """One candidate token at a position."""

    token: str
    logprob: float
    rank: int | None = None
    token_id: int | None = None
    masked: bool = False  # a structured-output grammar forbade it here

    @property
    def prob(self) -> float:
        return math.exp(self.logprob)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if not self.masked:
            del out["masked"]
        return out


@dataclass(frozen=True)
class LogprobRow:
    """One position: the chosen token and the alternatives the source returned."""

    position: int
    token: str
    logprob: float | None
    rank: int | None = None
    token_id: int | None = None
    top: tuple[Alternative, ...] = ()
    part: str = "generated"  # "prompt" | "generated" | "scored" (a given text's, `scoring.py`)
    allowed: int | None = None  # tokens a structured-output grammar allowed here (None: free)
    masked: tuple[Alternative, ...] = ()  # the model's top candidates the grammar masked
    stats: TokenStats | None = None  # the whole distribution here (`token_stats`), if asked

    @property
    def prob(self) -> float | None:
        return None if self.logprob is None else math.exp(self.logprob)

    @property
    def constrained(self) -> bool:
        return self.allowed is not None

    @property
    def overruled(self) -> bool:
        """The grammar masked a token the model found more likely than the chosen one."""
        return any(self.logprob is None or a.logprob > self.logprob for a in self.masked)

    @property
    def top_mass(self) -> float | None:
        """Probability mass of the returned top-k (the engine's, with `stats`), else of the
        returned alternatives."""
        if self.stats is not None:
            return self.stats.top_k_mass
        return sum(a.prob for a in self.top) if self.top else None

    @property
    def margin(self) -> float | None:
        """Logprob of the best token minus the second best (with `stats`; else unknown)."""
        return None if self.stats is None else self.stats.margin

    @property
    def entropy_kind(self) -> str | None:
        """Which entropy `entropy` is: "full" (the whole vocabulary, from the engine's
        `token_stats`), "top-k" (the returned alternatives, renormalised) or None (none)."""
        if self.stats is not None:
            return "full"
        return "top-k" if self.entropy is not None else None

    @property
    def entropy(self) -> float | None:
        """Entropy (nats): of the whole distribution with `stats`, else over the returned
        alternatives, renormalised to sum to one (`entropy_kind` says which)."""
        if self.stats is not None:
            return self.stats.entropy
        if not self.top:
            return None
        probs = [a.prob for a in self.top]
        total = sum(probs)
        if total <= 0:
            return None
        return -sum(p / total * math.log(p / total) for p in probs if p > 0)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["top"] = [a.to_dict() for a in self.top]
        out["entropy"] = self.entropy
        if self.stats is None:  # rows without token_stats read as before they existed
            del out["stats"]
        else:
            out["stats"] = self.stats.to_json()
            out["entropy_kind"] = self.entropy_kind
        if self.allowed is None:  # unconstrained rows read as before grammars existed
            del out["allowed"], out["masked"]
        else:
            out["masked"] = [a.to_dict() for a in self.masked]
        return out


@dataclass(frozen=True)
class LogprobTable:
    """Logprobs of one choice, position by position.

    >>> row = LogprobRow(0, "Hi", -0.1, 1, None, (Alternative("Hi", -0.1, 1),
    ...                                           Alternative("Hello", -2.5, 2)))
    >>> table = LogprobTable((row,))
    >>> table[-1].token, round(table[0].entropy, 4)
    ('Hi', 0.2865)
    >>> table
    LogprobTable(1 generated positions, 0 prompt positions, mean logprob -0.1000)
    """

    rows: tuple[LogprobRow, ...]
    prompt: tuple[LogprobRow, ...] = field(default=())
    source: str = ""

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_response(cls, response: Any, choice: int = 0, tokenizer: Any = None
                      ) -> "LogprobTable":
        """Any supported response: a `RequestOutput`, a completion or a chat completion."""
        if hasattr(response, "prompt_token_ids") and hasattr(response, "outputs"):
            return cls.from_request_output(response, choice, tokenizer)
        body = _as_dict(response)
        first = (body.get("choices") or [{}])[0]
        if "message" in first or "delta" in first or body.get("object", "").startswith("chat"):
            return cls.from_chat(body, choice)
        return cls.from_completion(body, choice)

    @classmethod
    def from_request_output(cls, output: Any, index: int = 0, tokenizer: Any = None
                            ) -> "LogprobTable":
        """Our engine's `RequestOutput` (sample `index`); `tokenizer` decodes missing texts."""
        sample = output.outputs[index]
        steps = getattr(sample, "grammar_steps", None) or []
        positions = sample.logprobs if sample.logprobs is not None else (
            [None] * len(sample.token_ids) if steps else [])
        stats = getattr(sample, "token_stats", None)
        rows = tuple(_with_stats(_with_grammar(_engine_row(i, tid, pos, tokenizer, "generated"),
                                               steps[i] if i < len(steps) else None, tokenizer),
                                 stats, i)
                     for i, (tid, pos) in enumerate(zip(sample.token_ids, positions)))
        prompt = ()
        if output.prompt_logprobs is not None:
            prompt_stats = getattr(output, "prompt_token_stats", None)
            prompt = tuple(_with_stats(_engine_row(i, tid, pos, tokenizer, "prompt"),
                                       prompt_stats, i) for i, (tid, pos)
                           in enumerate(zip(output.prompt_token_ids, output.prompt_logprobs)))
        return cls(rows, prompt, "engine")

    @classmethod
    def from_completion(cls, body: Any, choice: int = 0) -> "LogprobTable":
        """A `/v1/completions` body (legacy logprobs; `prompt_logprobs` when present)."""
        body = _as_dict(body)
        ch = _choice(body, choice)
        lp = ch.get("logprobs") or {}
        stats = _json_stats(lp.get("token_stats"))
        rows = []
        for i, token in enumerate(lp.get("tokens") or []):
            logprob = (lp.get("token_logprobs") or [None])[i] if i < len(
                lp.get("token_logprobs") or []) else None
            tops = (lp.get("top_logprobs") or [])
            top = _ranked((tops[i] or {}).items() if i < len(tops) else ())
            rows.append(_with_stats(LogprobRow(i, token, logprob, _rank_of(token, logprob, top),
                                               None, top), stats, i))
        prompt = _json_prompt_rows(ch.get("prompt_logprobs"), ch.get("prompt_token_ids"),
                                   ch.get("prompt_token_stats"))
        return cls(tuple(rows), prompt, "completions")

    @classmethod
    def from_chat(cls, body: Any, choice: int = 0) -> "LogprobTable":
        """A `/v1/chat/completions` body (`logprobs.content`; vLLM's `prompt_logprobs`)."""
        body = _as_dict(body)
        ch = _choice(body, choice)
        content = (ch.get("logprobs") or {}).get("content") or []
        stats = _json_stats((ch.get("logprobs") or {}).get("token_stats"))
        rows = []
        for i, entry in enumerate(content):
            top = _ranked((a["token"], a["logprob"]) for a in entry.get("top_logprobs") or [])
            logprob = entry.get("logprob")
            rows.append(_with_stats(LogprobRow(i, entry["token"], logprob,
                                               _rank_of(entry["token"], logprob, top), None, top),
                                    stats, i))
        prompt = _json_prompt_rows(body.get("prompt_logprobs"), body.get("prompt_token_ids"),
                                   body.get("prompt_token_stats"))
        return cls(tuple(rows), prompt, "chat")

    # -- access -----------------------------------------------------------------------------
    def __getitem__(self, position: int) -> LogprobRow:
        return self.rows[position]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[LogprobRow]:
        return iter(self.rows)

    @property
    def tokens(self) -> list[str]:
        return [r.token for r in self.rows]

    @property
    def logprobs(self) -> list[float | None]:
        return [r.logprob for r in self.rows]

    @property
    def constrained(self) -> bool:
        """Some position was under a structured-output grammar."""
        return any(r.constrained for r in self.rows)

    @property
    def overruled(self) -> list[int]:
        """Positions where the grammar masked a token the model preferred."""
        return [r.position for r in self.rows if r.overruled]

    @property
    def has_stats(self) -> bool:
        """Some position carries the engine's `token_stats` (exact entropy, rank, margin)."""
        return any(r.stats is not None for r in (*self.prompt, *self.rows))

    @property
    def entropy_kind(self) -> str | None:
        """Which entropy the table's rows have: "full", "top-k", "mixed" or None (none)."""
        kinds = {r.entropy_kind for r in (*self.prompt, *self.rows)} - {None}
        return None if not kinds else kinds.pop() if len(kinds) == 1 else "mixed"

    @property
    def mean_logprob(self) -> float | None:
        known = [r.logprob for r in self.rows if r.logprob is not None]
        return sum(known) / len(known) if known else None

    @property
    def total_logprob(self) -> float | None:
        """The rows' logprobs summed: a scored text's log-probability given its context."""
        known = [r.logprob for r in self.rows if r.logprob is not None]
        return sum(known) if known else None

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "rows": [r.to_dict() for r in self.rows],
                "prompt": [r.to_dict() for r in self.prompt]}

    def to_frame(self):
        """One row per position (prompt positions first, `part` tells them apart)."""

        records = []
        for r in (*self.prompt, *self.rows):
            records.append({"part": r.part, "position": r.position, "token": r.token,
                            "token_id": r.token_id, "logprob": r.logprob, "prob": r.prob,
                            "rank": r.rank, "entropy": r.entropy, "top_mass": r.top_mass,
                            "top": [(a.token, a.logprob) for a in r.top],
                            "allowed": r.allowed, "overruled": r.overruled,
                            "masked": [(a.token, a.logprob) for a in r.masked],
                            "margin": r.margin, "entropy_kind": r.entropy_kind})
        columns = ["part", "position", "token", "token_id", "logprob", "prob", "rank",
                   "entropy", "top_mass", "top"]
        if self.has_stats:  # the engine's token_stats: which entropy, and the margin
            columns[8:8] = ["entropy_kind", "margin"]
        if self.constrained:  # grammar columns only where a grammar was at work
            columns += ["allowed", "overruled", "masked"]
        return frame(records, columns, {
            **dict.fromkeys(["token_id", "rank"], "Int64"),
            **dict.fromkeys(["logprob", "prob", "entropy", "top_mass", "margin"], "Float64"),
            "allowed": "Int64", "overruled": "boolean", "entropy_kind": "string"})

    def __repr__(self) -> str:
        kind = f", entropy {self.entropy_kind}" if self.has_stats else ""
        part = "scored" if self.rows and all(r.part == "scored" for r in self.rows) \
            else "generated"
        return (f"LogprobTable({len(self.rows)} {part} positions, {len(self.prompt)} prompt "
                f"positions, mean logprob {h.fmt(self.mean_logprob)}{kind})")

    def diff(self, other: "LogprobTable", names: tuple[str, str] = ("a", "b")):
        """Position by position against another table of the same prompt (`LogprobDiff`)."""
        return LogprobDiff.of(self, other, *names)

    # -- views ------------------------------------------------------------------------------
    def _repr_html_(self) -> str:
        """Tokens coloured by probability; hover shows logprob, rank, entropy, alternatives."""
        spans = []
        for r in (*self.prompt, *self.rows):
            alts = "; ".join(f"{a.token!r} {h.fmt(a.logprob)}{' masked' if a.masked else ''}"
                             for a in r.top)
            title = (f"{r.part} {r.position} {r.token!r}: logprob {h.fmt(r.logprob)}, rank "
                     f"{r.rank if r.rank is not None else '—'}, entropy {h.fmt(r.entropy)}"
                     + _stats_note(r) + (f" | {alts}" if alts else "") + _grammar_note(r))
            border = "border-bottom:2px solid #888;" if r.part == "prompt" else ""
            if r.overruled:  # the grammar overruled the model here: a red outline
                border += "outline:1px dashed #c0392b;"
            spans.append(f'<span title="{h.escape(title)}" style="{h.on(h.prob_color(r.prob))};'
                         f'{border}padding:1px 0;margin:0 1px;'
                         f'white-space:pre">{h.escape(h.visible(r.token))}</span>')
        extra = [("prompt", "border-bottom:2px solid #888")] if self.prompt else []
        if any(r.overruled for r in self.rows):
            extra.append(("grammar overruled the model", "outline:1px dashed #c0392b"))
        div_id = h.content_id("wb-logprobs", self.to_dict())
        return h.themed(f'<div id="{div_id}" style="font-family:monospace;line-height:1.9">'
                        f'{h.caption(h.escape(repr(self)) + "; hover a token for its numbers")}'
                        f'{h.prob_legend(extra)}{"".join(spans)}</div>')

    def plot(self, k: int | None = None, ax: Any = None):
        """Matplotlib heatmap of probabilities: generated positions x top-k rank."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib

        k = k or max((len(r.top) for r in self.rows), default=1) or 1
        grid = [[(r.top[j].prob if j < len(r.top) else float("nan")) for j in range(k)]
                for r in self.rows]
        if ax is None:
            _, ax = plt.subplots(figsize=(1 + 0.9 * k, 0.5 + 0.35 * max(len(self.rows), 1)))
        image = ax.imshow(grid or [[float("nan")] * k], aspect="auto", cmap="viridis", vmin=0,
                          vmax=1)
        ax.figure.colorbar(image, ax=ax, label="probability")
        for i, r in enumerate(self.rows):
            for j, a in enumerate(r.top[:k]):
                ax.text(j, i, h.visible(a.token)[:10], ha="center", va="center",
                        fontsize=7, color="white" if a.prob < 0.5 else "black")
        ax.set_yticks(range(len(self.rows)), [f"{r.position}: {r.token!r}" for r in self.rows],
                      fontsize=7)
        ax.set_xticks(range(k), [str(j + 1) for j in range(k)])
        ax.set_xlabel("rank among returned alternatives")
        ax.set_ylabel("generated position: chosen token")
        ax.set_title("top-k probabilities per position (text: the alternative token)", fontsize=9)
        return neutral(ax)

    heatmap = plot  # the earlier name


# -- helpers ------------------------------------------------------------------------------------

def _as_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "model_dump"):  # our pydantic models and the openai client's
        return obj.model_dump()
    raise TypeError(f"cannot read logprobs from a {type(obj).__name__}")


def _choice(body: dict[str, Any], index: int) -> dict[str, Any]:
    for ch in body.get("choices") or []:
        if ch.get("index", 0) == index:
            return ch
    raise IndexError(f"the response has no choice {index}")


def _ranked(pairs: Any) -> tuple[Alternative, ...]:
    """(token, logprob) pairs sorted by logprob, ranks 1..k in that order."""
    ordered = sorted(((t, lp) for t, lp in pairs if lp is not None), key=lambda x: -x[1])
    return tuple(Alternative(t, lp, i + 1) for i, (t, lp) in enumerate(ordered))


def _rank_of(token: str, logprob: float | None, top: tuple[Alternative, ...]) -> int | None:
    """A JSON source has no rank: the chosen token's place among the alternatives, if there."""
    return next((a.rank for a in top if a.token == token and a.logprob == logprob), None)


def _engine_row(i: int, token_id: int, position: Mapping | None, tokenizer: Any,
                part: str) -> LogprobRow:
    def text(tid: int, lp: Any) -> str:
        if lp is not None and lp.decoded_token is not None:
            return lp.decoded_token
        return tokenizer.decode([tid]) if tokenizer is not None else f"<{tid}>"

    if position is None:
        return LogprobRow(i, text(token_id, None), None, None, token_id, (), part)
    chosen = position.get(token_id)
    ordered = sorted(position.items(), key=lambda kv: (-kv[1].logprob, kv[0]))
    top = tuple(Alternative(text(tid, lp), lp.logprob, lp.rank, tid) for tid, lp in ordered)
    return LogprobRow(i, text(token_id, chosen), None if chosen is None else chosen.logprob,
                      None if chosen is None else chosen.rank, token_id, top, part)


def _with_grammar(row: LogprobRow, step: Any, tokenizer: Any) -> LogprobRow:
    """The row with what the grammar did at its position (`GrammarStep`), if anything."""
    if step is None:
        return row
    known = {a.token_id: a.token for a in row.top}

    def text(tid: int) -> str:
        if tid in known:
            return known[tid]
        return tokenizer.decode([tid]) if tokenizer is not None else f"<{tid}>"

    masked = tuple(Alternative(text(t), lp, None, t, True)
                   for t, lp in sorted(step.masked.items(), key=lambda kv: (-kv[1], kv[0])))
    top = tuple(replace(a, masked=a.token_id in step.masked) for a in row.top)
    return replace(row, top=top, allowed=step.num_allowed, masked=masked)


def _with_stats(row: LogprobRow, stats: Any, i: int) -> LogprobRow:
    """The row with position `i`'s `TokenStats` (of a list, or None), its rank the stats' one:
    over the whole vocabulary (a JSON source's rank is only the place among what it returned)."""
    one = stats[i] if stats is not None and i < len(stats) else None
    return row if one is None else replace(row, stats=one, rank=one.rank)


def _json_stats(stats: Any) -> list[TokenStats | None] | None:
    """A workbench body's `token_stats` / `prompt_token_stats` (dicts or None per position)."""
    if stats is None:
        return None
    return [None if s is None else TokenStats(float(s["entropy"]), int(s["rank"]),
                                              float(s["margin"]), float(s["top_k_mass"]))
            for s in stats]


def _stats_note(row: LogprobRow) -> str:
    if row.stats is None:
        return ""
    return (f" (full vocabulary), margin {h.fmt(row.margin)}, top-k mass "
            f"{h.fmt(row.top_mass)}")


def _grammar_note(row: LogprobRow) -> str:
    if row.allowed is None:
        return ""
    masked = "; ".join(f"{a.token!r} {h.fmt(a.logprob)}" for a in row.masked)
    return (f" | grammar: {row.allowed} allowed" + (f", masked {masked}" if masked else "")
            + (" (overruled the model)" if row.overruled else ""))


def _json_prompt_rows(prompt_logprobs: Any, prompt_token_ids: Any, prompt_token_stats: Any = None
                      ) -> tuple[LogprobRow, ...]:
    """vLLM's `prompt_logprobs`: per position `{token_id: {logprob, rank, decoded_token}}`;
    the prompt's own token is `prompt_token_ids[i]` when returned, else the first entry;
    a workbench server's `prompt_token_stats` beside them."""
    if not prompt_logprobs:
        return ()
    stats = _json_stats(prompt_token_stats)
    return tuple(_with_stats(row, stats, row.position)
                 for row in _json_prompt_positions(prompt_logprobs, prompt_token_ids))


def _json_prompt_positions(prompt_logprobs: Any, prompt_token_ids: Any) -> list[LogprobRow]:
    rows = []
    for i, position in enumerate(prompt_logprobs):
        given = prompt_token_ids[i] if prompt_token_ids and i < len(prompt_token_ids) else None
        if not position:
            rows.append(LogprobRow(i, "" if given is None else f"<{given}>", None, None, given,
                                   (), "prompt"))
            continue
        entries = [(int(tid), e) for tid, e in position.items()]
        tid = given if given is not None else entries[0][0]
        chosen = dict(entries).get(tid) or {}
        ordered = sorted(entries, key=lambda kv: (-kv[1]["logprob"], kv[0]))
        top = tuple(Alternative(e.get("decoded_token") or f"<{t}>", e["logprob"], e.get("rank"), t)
                    for t, e in ordered)
        rows.append(LogprobRow(i, chosen.get("decoded_token") or f"<{tid}>", chosen.get("logprob"),
                               chosen.get("rank"), tid, top, "prompt"))
    return rows
