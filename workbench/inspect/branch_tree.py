"""`BranchTree`: "what if token k were X" — an output and its branches, each one forced at a
position to another token and continued from there.

Each path is the generated tokens from the first one on (`Path`): the original's, and each
branch's, which repeats the original's tokens before its position, then holds the forced token,
then the continuation the model generated after it (`Branch`). Logprobs are per token, with
the cumulative sum along a path (`Path.cumulative`: None from the first unknown logprob on).
`diverges_at(i)` is the first position where branch `i`'s tokens differ from the original's
(its own position, unless it was forced to the original's token there). `LLM.branch` and
`Workbench.branch` build one; `BranchTree.of(output, tokenizer)` is an output's tree without
branches (the `TokenExplorer` widget's start), from a `RequestOutput` or a completions body
asked with `return_token_ids` (and, for alternatives, `logprobs` with
`return_tokens_as_token_ids`).

>>> a, b = PathToken(5, "a", -0.1, ((5, -0.1), (6, -2.4))), PathToken(7, "b", -0.3)
>>> tree = BranchTree([1], Path((a, b), "ab"), [Branch(0, Path((PathToken(6, "c", -2.4),), "c"))])
>>> tree.diverges_at(0), tree.branches[0].token_id, tree.original.cumulative_logprob
(0, 6, -0.4)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

from workbench.display import html as h
from workbench.display.figure import GREY, neutral
from workbench.display.frames import frame
from workbench.errors import ValidationError

__all__ = ["Branch", "BranchTree", "Path", "PathToken"]

TokenText = Callable[[int], str]


@dataclass(frozen=True)
class PathToken:
    """One generated token: its id, text, logprob (None: unknown), and the (id, logprob) pairs
    the source returned at its position, best first (the token itself among them)."""

    token_id: int
    text: str
    logprob: float | None
    top: tuple[tuple[int, float], ...] = ()

    def alternatives(self) -> list[tuple[int, float]]:
        """The returned (id, logprob) pairs at this position other than this token, best first."""
        return [(t, lp) for t, lp in self.top if t != self.token_id]


@dataclass(frozen=True)
class Path:
    """The tokens one sequence generated, from the first on, with its text and finish reason."""

    tokens: tuple[PathToken, ...]
    text: str
    finish_reason: str | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def token_ids(self) -> list[int]:
        return [t.token_id for t in self.tokens]

    @property
    def logprobs(self) -> list[float | None]:
        return [t.logprob for t in self.tokens]

    def cumulative(self) -> list[float | None]:
        """The running sum of the logprobs: None from the first unknown one on."""
        out: list[float | None] = []
        total: float | None = 0.0
        for lp in self.logprobs:
            total = None if total is None or lp is None else total + lp
            out.append(total)
        return out

    @property
    def cumulative_logprob(self) -> float | None:
        return self.cumulative()[-1] if self.tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"token_ids": self.token_ids, "tokens": [t.text for t in self.tokens],
                "logprobs": self.logprobs, "cumulative_logprob": self.cumulative_logprob,
                "top": [[list(p) for p in t.top] for t in self.tokens], "text": self.text,
                "finish_reason": self.finish_reason}


@dataclass(frozen=True)
class Branch:
    """The original forced at `position` to `path.tokens[position]` and continued; `path` is the
    whole generated path (the original's tokens before `position` first). `output` is what the
    engine or the server answered for it (a `RequestOutput`, or its completions choice);
    `num_cached_tokens`: its prompt's tokens served from the prefix cache (None: not reported)."""

    position: int
    path: Path
    num_cached_tokens: int | None = None
    output: Any = field(default=None, repr=False, compare=False)

    @property
    def token(self) -> PathToken:
        """The forced token."""
        return self.path.tokens[self.position]

    @property
    def token_id(self) -> int:
        return self.token.token_id

    @property
    def continuation(self) -> tuple[PathToken, ...]:
        """What the model generated after the forced token."""
        return self.path.tokens[self.position + 1:]


class BranchTree:
    """An output's generated tokens and its branches (see the module docstring)."""

    def __init__(self, prompt_token_ids: Sequence[int], original: Path,
                 branches: Iterable[Branch] = (), prompt: str | None = None):
        self.prompt_token_ids = list(prompt_token_ids)
        self.original = original
        self.branches = list(branches)
        self.prompt = prompt

    @classmethod
    def of(cls, output: Any, tokenizer: Any, index: int = 0) -> "BranchTree":
        """The tree of one output without branches: a `RequestOutput` (completion `index`), or a
        completions body (a dict, or a `Result`) whose choice `index` has `token_ids` and
        `prompt_token_ids` (`return_token_ids=True`)."""
        text = token_texts(tokenizer)
        if hasattr(output, "outputs") and hasattr(output, "prompt_token_ids"):
            if output.prompt_token_ids is None:
                raise _invalid("a prompt given as embeddings has no token ids to branch from",
                               "output")
            return cls(output.prompt_token_ids, path_of_output(completion_of(output, index), text),
                       prompt=output.prompt)
        choice = choice_of(output, index)
        return cls(choice["prompt_token_ids"], path_of_choice(choice, text))

    def __len__(self) -> int:
        return len(self.branches)

    def __getitem__(self, i: int) -> Branch:
        return self.branches[i]

    def __repr__(self) -> str:
        return (f"BranchTree({len(self.original)} tokens, {len(self.branches)} branches at "
                f"positions {sorted({b.position for b in self.branches})})")

    def with_branches(self, branches: Iterable[Branch]) -> "BranchTree":
        """This tree with `branches` added after its own."""
        return BranchTree(self.prompt_token_ids, self.original, [*self.branches, *branches],
                          self.prompt)

    def diverges_at(self, i: int) -> int | None:
        """The first position where branch `i`'s tokens differ from the original's (None: the
        same tokens throughout; a path that ends earlier diverges where it ends)."""
        mine, theirs = self.branches[i].path.token_ids, self.original.token_ids
        for k, (a, b) in enumerate(zip(mine, theirs)):
            if a != b:
                return k
        return None if len(mine) == len(theirs) else min(len(mine), len(theirs))

    def divergences(self) -> list[dict[str, Any]]:
        """For each branch: its position, where it diverges, and the original's and its token
        there."""
        rows = []
        for i, b in enumerate(self.branches):
            at = self.diverges_at(i)
            orig = self.original.tokens[at] if at is not None and at < len(self.original) else None
            mine = b.path.tokens[at] if at is not None and at < len(b.path) else None
            rows.append({"branch": i, "position": b.position, "diverges_at": at,
                         "original_token_id": orig.token_id if orig else None,
                         "original_token": orig.text if orig else None,
                         "token_id": mine.token_id if mine else None,
                         "token": mine.text if mine else None})
        return rows

    # -- the protocol ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"prompt_token_ids": self.prompt_token_ids, "prompt": self.prompt,
                "original": self.original.to_dict(),
                "branches": [{"position": b.position, "token_id": b.token_id,
                              "diverges_at": self.diverges_at(i),
                              "num_cached_tokens": b.num_cached_tokens, **b.path.to_dict()}
                             for i, b in enumerate(self.branches)]}

    def to_frame(self):
        """One row per token: the original's every token, each branch's from its position on
        (`cum_logprob` runs along the whole path, the shared tokens included)."""
        records = []
        for name, branch, path, start in self._paths():
            cumulative = path.cumulative()
            for k in range(start, len(path)):
                t = path.tokens[k]
                records.append({"path": name, "branch": branch, "position": k,
                                "token_id": t.token_id, "token": t.text, "logprob": t.logprob,
                                "cum_logprob": cumulative[k],
                                "forced": branch is not None and k == start})
        return frame(records, ["path", "branch", "position", "token_id", "token", "logprob",
                               "cum_logprob", "forced"],
                     {"branch": "Int64", "logprob": "Float64", "cum_logprob": "Float64",
                      "forced": "boolean"})

    def _paths(self) -> list[tuple[str, int | None, Path, int]]:
        """(name, branch index, path, first position of its own) of the original and each branch."""
        return [("original", None, self.original, 0)] + [
            (f"branch {i}", i, b.path, b.position) for i, b in enumerate(self.branches)]

    def plot(self, ax=None):
        """The cumulative logprob along each path (x = position); a branch's line starts where it
        leaves the original (its forced token marked). Returns the Axes."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib

        if ax is None:
            _, ax = plt.subplots(figsize=(7, 3))
        for name, branch, path, start in self._paths():
            cumulative = path.cumulative()
            xs = [k for k in range(max(start - 1, 0), len(path)) if cumulative[k] is not None]
            ys = [cumulative[k] for k in xs]
            if not xs:
                continue
            colour = GREY if branch is None else f"C{branch % 10}"
            ax.plot(xs, ys, color=colour, lw=2.0 if branch is None else 1.2, label=name,
                    marker="." if branch is None else None)
            if branch is not None and cumulative[start] is not None:
                ax.plot([start], [cumulative[start]], marker="o", color=colour)
        ax.set_xlabel("generated position")
        ax.set_ylabel("cumulative logprob")
        ax.set_title(repr(self))
        if ax.lines:
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
        return neutral(ax)

    def _repr_html_(self) -> str:
        return self.to_html()

    def to_html(self, selected: int | None = None, interactive: bool = False) -> str:
        """Deterministic HTML: one row per path on a grid of positions (tokens coloured by their
        probability, each forced token outlined, the original's token at a branch point dotted),
        then a table of the branches. `selected`: the original's position outlined in blue
        (the `TokenExplorer`'s); `interactive`: the original's tokens post their position to the
        explorer's hidden `.wb-pick` box when clicked."""
        width = max([len(self.original)] + [len(b.path) for b in self.branches])
        points = {b.position for b in self.branches}
        cells = []
        for row, (name, branch, path, start) in enumerate(self._paths(), start=1):
            was = (h.visible(self.original.tokens[start].text) if start < len(self.original)
                   else h.EMPTY_TOKEN)
            label = (name if branch is None else
                     f"{name}: {was} → {h.visible(path.tokens[start].text)}")
            cells.append(f'<div style="grid-row:{row};grid-column:1;padding:1px 6px 1px 0;'
                         f'white-space:pre">{h.escape(label)}</div>')
            for k in range(start, len(path)):
                t = path.tokens[k]
                prob = None if t.logprob is None else math.exp(t.logprob)
                mark = ""
                if branch is not None and k == start:
                    mark = "outline:2px solid #d62728;"
                elif branch is None and k == selected:
                    mark = "outline:2px solid #1f77b4;"
                elif branch is None and k in points:
                    mark = "outline:1px dotted #d62728;"
                clickable = interactive and branch is None
                pick = f' data-pick="{k}" onclick="{h.escape(_PICK)}"' if clickable else ""
                title = f"{t.text!r} position {k} logprob {h.fmt(t.logprob)}"
                style = (f"{h.on(h.prob_color(prob))};{mark}padding:0 1px;margin:0 1px;"
                         f"white-space:pre{';cursor:pointer' if clickable else ''}")
                cells.append(f'<div style="grid-row:{row};grid-column:{k + 2};padding:1px 0">'
                             f'<span{pick} title="{h.escape(title)}" style="{style}">'
                             f"{h.escape(h.visible(t.text))}</span></div>")
        grid = (f'<div style="display:grid;grid-template-columns:auto repeat({width},auto);'
                f'justify-content:start;row-gap:4px;line-height:1.7">{"".join(cells)}</div>')
        rows = [("original", "—", "—", "—", h.fmt(self.original.cumulative_logprob),
                 h.escape(self.original.finish_reason or "—"), "—")]
        for i, b in enumerate(self.branches):
            at = self.diverges_at(i)
            rows.append((f"branch {i}", b.position, "—" if at is None else at,
                         f"{h.token_html(b.token.text)} ({b.token_id}, logprob "
                         f"{h.fmt(b.token.logprob)})", h.fmt(b.path.cumulative_logprob),
                         h.escape(b.path.finish_reason or "—"),
                         "—" if b.num_cached_tokens is None else b.num_cached_tokens))
        table = h.table(["path", "position", "diverges at", "forced token", "cum logprob",
                         "finish", "cached prompt tokens"], rows, escape_cells=False)
        summary = (f"{len(self.original)} generated tokens, {len(self.branches)} branch"
                   f"{'' if len(self.branches) == 1 else 'es'}")
        legend = h.prob_legend([("forced", "outline:2px solid #d62728"),
                                ("branch point", "outline:1px dotted #d62728")])
        return h.themed(
            f'<div class="wb-branch-tree" style="font-family:monospace;font-size:12px">'
            f'<div class="wb-summary">{h.escape(summary)}</div>{legend}'
            f'<div style="overflow-x:auto;margin:4px 0">{grid}</div>{table}</div>')


# a click on one of the original's tokens posts its position to the explorer's hidden box
_PICK = ("var r=this.closest('.wb-token-explorer'),i=r&&r.querySelector('.wb-pick input');"
         "if(i){i.value=this.getAttribute('data-pick');"
         "i.dispatchEvent(new Event('change',{bubbles:true}))}")


# -- building paths (the facades' side) -------------------------------------------------------
def _invalid(message: str, parameter: str, value: Any = None) -> ValidationError:
    return ValidationError(message, parameter=parameter, value=value)


def token_texts(tokenizer: Any) -> TokenText:
    """A memoized `id -> text` of single tokens (special tokens kept)."""
    cache: dict[int, str] = {}

    def text(token_id: int) -> str:
        if token_id not in cache:
            cache[token_id] = tokenizer.decode([token_id], skip_special_tokens=False)
        return cache[token_id]

    return text


def completion_of(output: Any, index: int) -> Any:
    """Completion `index` of a `RequestOutput`, refused by name when it has none such."""
    found = [c for c in output.outputs if c.index == index]
    if not found:
        raise _invalid(f"the output has no completion with index {index} (it has "
                       f"{sorted(c.index for c in output.outputs)}).", "index", index)
    return found[0]


def path_of_output(completion: Any, text: TokenText) -> Path:
    """A `CompletionOutput`'s tokens with their logprobs and top alternatives."""
    tokens = []
    for k, token_id in enumerate(completion.token_ids):
        position = completion.logprobs[k] if completion.logprobs else None
        top = tuple(sorted(((t, lp.logprob) for t, lp in (position or {}).items()),
                           key=lambda p: (-p[1], p[0])))
        logprob = position[token_id].logprob if position and token_id in position else None
        tokens.append(PathToken(token_id, text(token_id), logprob, top))
    return Path(tuple(tokens), completion.text, completion.finish_reason)


def choice_of(body: Any, index: int) -> dict[str, Any]:
    """Choice `index` of a completions body (a dict or a `Result`) with its token ids."""
    response = getattr(body, "response", body)
    if getattr(body, "error", None) is not None:
        raise _invalid(f"the result is an error, not a completion: {body.error}", "result")
    if not isinstance(response, dict) or not response.get("choices") or any(
            "message" in c for c in response["choices"]):
        raise _invalid("branching takes a completions result (`Workbench.completions`, or its "
                       "body).", "result")
    found = [c for c in response["choices"] if c.get("index") == index]
    if not found:
        raise _invalid(f"the result has no choice with index {index}.", "index", index)
    choice = found[0]
    if choice.get("token_ids") is None or choice.get("prompt_token_ids") is None:
        raise _invalid("the result has no token ids: ask for them with return_token_ids=True "
                       "(and logprobs=N, return_tokens_as_token_ids=True for its alternatives).",
                       "return_token_ids")
    return choice


def _token_id(key: str) -> int | None:
    """The id of a `token_id:N` key (`return_tokens_as_token_ids`), else None."""
    if key.startswith("token_id:"):
        try:
            return int(key[len("token_id:"):])
        except ValueError:
            return None
    return None


def path_of_choice(choice: dict[str, Any], text: TokenText) -> Path:
    """A completions choice's tokens (`token_ids`) with their logprobs; alternatives where the
    top logprobs came as `token_id:N` keys (`return_tokens_as_token_ids`)."""
    ids = list(choice["token_ids"])
    logprobs = choice.get("logprobs") or {}
    chosen = logprobs.get("token_logprobs") or [None] * len(ids)
    tops = logprobs.get("top_logprobs") or [None] * len(ids)
    tokens = []
    for token_id, lp, top in zip(ids, chosen, tops):
        pairs = [(_token_id(k), v) for k, v in (top or {}).items()]
        known = tuple(sorted(((t, float(v)) for t, v in pairs if t is not None),
                             key=lambda p: (-p[1], p[0])))
        tokens.append(PathToken(token_id, text(token_id), None if lp is None else float(lp),
                                known if len(known) == len(pairs) else ()))
    return Path(tuple(tokens), choice.get("text") or "", choice.get("finish_reason"))


def forced_path(original: Path, position: int, token: PathToken, continuation: Path,
                text: str) -> Path:
    """A branch's whole path: the original's tokens before `position`, `token`, then what was
    generated after it."""
    return Path((*original.tokens[:position], token, *continuation.tokens), text,
                continuation.finish_reason)


# -- what a branch call forces (both facades) -------------------------------------------------
def check_position(original: Path, position: Any) -> None:
    """`position` must index one of the original's generated tokens."""
    if isinstance(position, bool) or not isinstance(position, Integral):
        raise _invalid(f"position must be an integer, got {position!r}.", "position", position)
    if not 0 <= position < len(original):
        raise _invalid(f"position {position} is out of range: the output generated "
                       f"{len(original)} tokens (positions 0 to {len(original) - 1}).",
                       "position", position)


def forced_tokens(original: Path, position: int, tokens: Any, top: Any,
                  vocab_size: int) -> list[int] | None:
    """The token ids to force at `position`: `tokens` checked, or the `top` best alternatives
    of the original's logprobs there; None where the output has no logprobs at all and `top`
    was asked (the caller asks the model for the position's `top + 1` best: `alternatives`)."""
    if tokens is not None and top is not None:
        raise _invalid("give tokens=[ids] or top=n, not both.", "top", top)
    if tokens is None and top is None:
        raise _invalid("say what to force: tokens=[ids], or top=n for the n best alternatives "
                       "at that position.", "tokens")
    if tokens is not None:
        if isinstance(tokens, Integral) and not isinstance(tokens, bool):
            tokens = [tokens]
        if isinstance(tokens, (str, bytes, dict)) or not isinstance(tokens, Iterable):
            raise _invalid(f"tokens must be a non-empty list of token ids, got {tokens!r}.",
                           "tokens", tokens)
        tokens = list(tokens)
        if not tokens:
            raise _invalid("tokens must be a non-empty list of token ids, got [].", "tokens", [])
        for t in tokens:
            if isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= t < vocab_size:
                raise _invalid(f"tokens holds {t!r}, which is not a token id of this model "
                               f"(0 to {vocab_size - 1}).", "tokens", t)
        if len(set(tokens)) != len(tokens):
            raise _invalid(f"tokens repeats an id: {list(tokens)}.", "tokens", list(tokens))
        return [int(t) for t in tokens]
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise _invalid(f"top must be an integer of at least 1, got {top!r}.", "top", top)
    token = original.tokens[position]
    if not any(t.top for t in original.tokens):  # no logprobs at all: ask the model
        return None
    return alternatives(token.top, token.token_id, top, position)


def alternatives(pairs: Sequence[tuple[int, float]], token_id: int, top: int,
                 position: int) -> list[int]:
    """The `top` best ids of `pairs` other than `token_id`, refused when there are fewer."""
    alts = [t for t, _ in sorted(pairs, key=lambda p: (-p[1], p[0])) if t != token_id]
    if not alts:
        raise _invalid(f"position {position} has no alternatives in the output's logprobs (only "
                       "the sampled token): generate with logprobs=n (n >= 1) to branch on its "
                       "top alternatives, or give tokens=[ids].", "top", top)
    if len(alts) < top:
        raise _invalid(f"top={top} but position {position} has only {len(alts)} alternatives "
                       f"in the output's logprobs: ask for top={len(alts)} or fewer, or generate "
                       f"with logprobs={top + 1} or more (the sampled token is among them).",
                       "top", top)
    return alts[:top]
