"""`TokenExplorer`: an output's tokens; pick one and an alternative from its top-k, and the
branch forced there runs and its continuation appears (`BranchTree`, `LLM.branch`).

Controls: the position (a slider; a click on a token in the drawing selects it too, through
the hidden `.wb-pick` box), that position's alternatives from the output's own logprobs (picking
one runs its branch; the Branch button runs the selection again after an error, and for an
output without logprobs asks the model for the position's best tokens and branches on each), a
status line and the view: the tree of every branch run so far (the selected position outlined
in blue), then the selected branch's text. While a branch runs the controls are disabled and the status
says what runs; an error is shown in the widget (`status`), never swallowed, and the tree so
far stays. `render` is a pure function of the tree and the selection; `to_html()` is the
fallback where widgets don't render.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from workbench.display import html as h
from workbench.errors import ValidationError
from workbench.inspect.branch_tree import Branch, BranchTree
from workbench.widgets.beam_explorer import error_html


def alternative_label(token_id: int, text: str, logprob: float | None) -> str:
    """One line of the alternatives list: token, id, logprob."""
    return f"{text!r} (id {token_id}) logprob {h.fmt(logprob)}"


def render(tree: BranchTree, position: int | None, branch: Branch | None = None,
           interactive: bool = False) -> str:
    """The tree with `position` outlined, then the selected branch's text (deterministic)."""
    parts = [tree.to_html(selected=position, interactive=interactive)]
    if position is not None and position < len(tree.original):
        token = tree.original.tokens[position]
        alts = token.alternatives()
        parts.append(f'<div class="wb-summary" style="margin-top:6px">position {position}: '
                     f"{h.token_html(token.text)} logprob {h.fmt(token.logprob)}, "
                     f"{len(alts)} alternatives in the output's logprobs</div>")
    if branch is not None:
        prefix = "".join(t.text for t in tree.original.tokens[:branch.position])
        rest = "".join(t.text for t in branch.continuation)
        parts.append(f'<div class="wb-branch" style="margin-top:6px;overflow-wrap:anywhere">'
                     f"branch at {branch.position}: {h.token_text(prefix)}"
                     f"<b>{h.token_html(branch.token.text)}</b>{h.token_text(rest)} "
                     f"(cum logprob {h.fmt(branch.path.cumulative_logprob)}, "
                     f"{h.escape(branch.path.finish_reason or '—')})</div>")
    return f'<div class="wb-token-step" style="font-family:monospace">{"".join(parts)}</div>'


class TokenExplorer(widgets.VBox):
    """Branches of one output, explored: a position, its alternatives and the tree so far.

    `TokenExplorer(llm, output)` for an `LLM` and its `RequestOutput`; `TokenExplorer(wb,
    result)` for a `Workbench` and a completions `Result` (asked with `return_token_ids=True`,
    `logprobs=N` and `return_tokens_as_token_ids=True`). `top` alternatives are listed per
    position (at most what the output returned). `tokenizer`: for a remote `Workbench` whose
    model we don't have (passed on to its `branch`). Each pick runs `source.branch(output,
    position, tokens=[id])` once; picking it again shows the branch already run.
    """

    def __init__(self, source: Any, output: Any, *, top: int = 5, index: int = 0,
                 tokenizer: Any = None, **kwargs: Any):
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise ValidationError(f"top must be an integer of at least 1, got {top!r}.",
                                  parameter="top", value=top)
        self.source, self.output, self.top, self.index = source, output, top, index
        self._tokenizer = tokenizer if tokenizer is not None else source.get_tokenizer()
        self._extra = {} if tokenizer is None else {"tokenizer": tokenizer}  # a remote's
        self.tree = BranchTree.of(output, self._tokenizer, index)
        self._runs: dict[tuple[int, int], Branch] = {}
        self._asks = not any(t.top for t in self.tree.original.tokens)  # no logprobs: ask
        self.branch: Branch | None = None  # the one shown
        last = max(len(self.tree.original) - 1, 0)
        self.position = widgets.IntSlider(value=0, min=0, max=last, description="position",
                                          continuous_update=False,
                                          layout=widgets.Layout(width="60%"))
        self.alternative = widgets.Select(options=[], rows=min(top, 8) + 1,
                                          description="alternative",
                                          layout=widgets.Layout(width="60%"))
        self.button = widgets.Button(description="Branch", icon="code-fork")
        self.status = widgets.HTML()
        self.pick = widgets.Text(layout=widgets.Layout(display="none"))  # the drawing's clicks
        self.pick.add_class("wb-pick")
        self.view = widgets.HTML()
        super().__init__(children=[self.position, widgets.HBox([self.alternative, self.button]),
                                   self.status, self.pick, self.view], **kwargs)
        self.add_class("wb-token-explorer")
        self.position.observe(self._on_position, names="value")
        self.alternative.observe(self._on_alternative, names="value")
        self.pick.observe(self._on_pick, names="value")
        self.button.on_click(lambda _: self.run(raise_errors=False))
        self.button.disabled = not len(self.tree.original)
        self._list()

    @property
    def busy(self) -> bool:
        """Whether a branch is running (the controls are disabled meanwhile)."""
        return self.button.description != "Branch"

    # -- actions -----------------------------------------------------------------------------
    def select(self, position: int, token_id: int | None = None) -> Branch | None:
        """Selects `position` and, given `token_id`, that alternative, which runs its branch
        (errors raised, and shown in the widget); returns the branch shown."""
        self.position.value = position
        if token_id is None:
            return None
        if token_id not in [value for _, value in self.alternative.options]:
            raise ValidationError(f"token {token_id} is not among the listed alternatives at "
                                  f"position {position}: "
                                  f"{[value for _, value in self.alternative.options]}.",
                                  parameter="token_id", value=token_id)
        self._set_alternative(token_id)
        return self.run()

    def run(self, raise_errors: bool = True) -> Branch | None:
        """Runs the branch of the selected position and alternative (once: a pick run before
        shows its branch again) and shows it; on an error the widget shows it, and raises it
        unless `raise_errors` is false (the controls' handlers)."""
        position, token_id = self.position.value, self.alternative.value
        if token_id is None and self._asks and not self._asked(position):
            return self._ask(position, raise_errors)
        if token_id is None:
            self.status.value = h.error_box("pick an alternative first.")
            if raise_errors:
                raise ValidationError("no alternative is selected.", parameter="alternative")
            return None
        done = self._runs.get((position, token_id))
        if done is None:
            text = self.tree.original.tokens[position].text
            self._busy(f"branching at position {position}: {text!r} → "
                       f"{self._tokenizer.decode([token_id])!r} …")
            try:
                tree = self.source.branch(self.output, position, tokens=[token_id],
                                          index=self.index, **self._extra)
            except Exception as exc:  # shown in the widget: a handler has nowhere to raise
                self._idle(error_html(exc))
                if raise_errors:
                    raise
                return None
            (done,) = tree.branches
            self._runs[(position, token_id)] = done
            self.tree = self.tree.with_branches([done])
        self.branch = done
        self._idle("")
        return done

    def _ask(self, position: int, raise_errors: bool) -> Branch | None:
        """The output has no logprobs: the model's `top` best at `position`, each branched
        (`source.branch(..., top=)`); they become the position's alternatives, the first shown."""
        self._busy(f"asking the model for the {self.top} best tokens at position {position} "
                   "and branching on each …")
        try:
            tree = self.source.branch(self.output, position, top=self.top, index=self.index,
                                      **self._extra)
        except Exception as exc:  # shown in the widget: a handler has nowhere to raise
            self._idle(error_html(exc))
            if raise_errors:
                raise
            return None
        for b in tree.branches:
            self._runs[(position, b.token_id)] = b
        self.tree = self.tree.with_branches(tree.branches)
        self.branch = tree.branches[0]
        self._idle("")
        self._list(self.branch.token_id)
        return self.branch

    def _asked(self, position: int) -> list[Branch]:
        """The branches run at `position`, in the order they ran."""
        return [b for (p, _), b in self._runs.items() if p == position]

    def _busy(self, line: str) -> None:
        self.button.disabled, self.button.description = True, "Branching…"
        self.button.icon = "spinner"
        self.position.disabled = self.alternative.disabled = True
        self.status.value = f'<div class="wb-busy" style="font-style:italic">{h.escape(line)}</div>'
        self.view.value = f'<div class="wb-dimmed" style="opacity:0.45">{self.view.value}</div>'

    def _idle(self, status: str) -> None:
        self.button.disabled, self.button.description = False, "Branch"
        self.button.icon = "code-fork"
        self.position.disabled = self.alternative.disabled = False
        self.status.value = status
        self._render()

    # -- reactions ---------------------------------------------------------------------------
    def _list(self, selected: int | None = None) -> None:
        """The selected position's alternatives (`selected` selected, without running), then
        redraws. Without logprobs in the output, those the model was asked for there."""
        position = self.position.value
        options: list[tuple[str, int]] = []
        if self._asks:
            options = [(alternative_label(b.token_id, b.token.text, b.token.logprob), b.token_id)
                       for b in self._asked(position)]
        elif position < len(self.tree.original):
            alts = self.tree.original.tokens[position].alternatives()[:self.top]
            options = [(alternative_label(t, self._tokenizer.decode([t]), lp), t)
                       for t, lp in alts]
        self._set_alternative(selected, options)
        if self._asks and not options and len(self.tree.original):
            self.status.value = h.caption(
                f"the output has no logprobs: Branch asks the model for the {self.top} best "
                f"tokens at position {position} and branches on each.")
        elif not options and len(self.tree.original):
            self.status.value = h.error_box(
                f"position {position} has no alternatives in the output's logprobs: generate "
                f"with logprobs={self.top + 1} to list them.")
        elif 'class="wb-error"' in self.status.value or 'class="wb-caption"' in self.status.value:
            self.status.value = ""
        self._render()

    def _set_alternative(self, value: int | None, options: list | None = None) -> None:
        self.alternative.unobserve(self._on_alternative, names="value")
        if options is not None:
            self.alternative.options = options
        self.alternative.value = value
        self.alternative.observe(self._on_alternative, names="value")

    def _on_position(self, change: dict) -> None:
        self.branch = None
        self._list()

    def _on_alternative(self, change: dict) -> None:
        if change["new"] is not None and not self.busy:
            self.run(raise_errors=False)

    def _on_pick(self, change: dict) -> None:
        """A click on one of the original's tokens in the drawing: its position."""
        value = change["new"]
        if not value or self.busy:
            return
        self.pick.value = ""  # the same token can be clicked again
        self.position.value = int(value)

    def _render(self) -> None:
        self.view.value = render(self.tree, self.position.value, self.branch, interactive=True)

    def to_html(self) -> str:
        """The tree and the selection as static HTML (where widgets don't render)."""
        return render(self.tree, self.position.value, self.branch)

    def _repr_html_(self) -> str:
        return self.to_html()
