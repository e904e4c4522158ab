"""`BeamExplorer`: a beam search's `BeamTree`, step by step, with a node's alternatives.

Controls: the prompt (Enter searches), beam width (at most `MAX_BEAM_WIDTH`, said so above it),
length penalty and a Search button (re-runs the search through `search`, by default
`llm.beam_search`); the number shown, the drawing's zoom and whether pruned candidates are
folded; a step slider showing the tree up to that step; a node selector listing that step's
kept, completed and returned candidates (or all). The HTML below shows the tree so far (the
tree's own SVG, in its own scrolling box; a click on a node selects it, on a `+N pruned` row
unfolds it) and, for the selected node, its path from the prompt, the candidates it competed
with (same parent) and those expanded from it at the next step. `tree_until` and `render_step`
are pure functions of the tree; `to_html()` is the fallback where widgets don't render.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

import ipywidgets as widgets

from workbench.display import html as h
from workbench.errors import ValidationError
from workbench.inspect.beam_tree import BeamNode, BeamTree
from workbench.sampling_params import BeamSearchParams
from workbench.serving.errors import error_response

Search = Callable[[str, int, float, int], BeamTree]  # (prompt, width, length_penalty, max_tokens)
MAX_BEAM_WIDTH = 16  # wider trees take long to search and draw; the explorer refuses them
ZOOMS = [("fit width", 0.0), ("50%", 0.5), ("75%", 0.75), ("100%", 1.0), ("150%", 1.5)]


def tree_until(tree: BeamTree, step: int) -> BeamTree:
    """The candidates of steps 1..`step` as a tree of their own (node ids renumbered)."""
    kept = [n for n in tree.nodes if n.step <= step]
    new_id = {n.id: i for i, n in enumerate(kept)}
    nodes = [replace(n, id=new_id[n.id], parent=None if n.parent is None else new_id[n.parent])
             for n in kept]
    returned = [new_id[i] for i in tree.returned if i in new_id]
    return BeamTree(list(tree.prompt_token_ids), tree.beam_width, tree.length_penalty, nodes,
                    returned, tree.prompt_text)


def node_label(node: BeamNode) -> str:
    """One line for a node selector: rank, status, token, logprob."""
    return (f"#{node.id} rank {node.rank} {node.status:9} {node.text!r} "
            f"logprob {h.fmt(node.logprob)}")


def _candidates(title: str, nodes: list[BeamNode], selected: int | None) -> str:
    rows = [(n.rank, (f"<b>{h.token_html(n.text)}</b>" if n.id == selected
                      else h.token_html(n.text)),
             n.status, h.fmt(n.logprob), h.fmt(n.cum_logprob), h.fmt(n.score)) for n in nodes]
    return (f'<div style="margin-top:6px"><b>{h.escape(title)}</b></div>'
            + h.table(["rank", "token", "status", "logprob", "cum logprob", "score"], rows,
                      escape_cells=False))


def on_returned_paths(tree: BeamTree) -> set[int]:
    """The ids of every node on a returned path."""
    return {n.id for i in range(len(tree.returned)) for n in tree.path(i)}


def render_step(tree: BeamTree, step: int, node_id: int | None = None,
                label: str = "cum_logprob", static: bool = False, *,
                expanded: Collection[int | None] | bool = (), zoom: float | None = None,
                interactive: bool = False) -> str:
    """The tree up to `step` with the returned paths and the selected node marked, then the
    node's alternatives (deterministic HTML); `expanded`, `zoom`, `interactive`: the drawing's
    (`BeamTree.to_svg`); `static`: the drawing with its picture copy for untrusted notebooks
    (the fallback, not the live view)."""
    nodes = tree.step(step)
    counts = Counter(n.status for n in nodes)
    summary = (f"step {step} of {tree.num_steps}: {len(nodes)} candidates "
               f"({counts['kept']} kept, {counts['completed']} completed, "
               f"{counts['pruned']} pruned)")
    selected = node_id if node_id is not None and tree[node_id].step <= step else None
    parts = [f'<div class="wb-summary">{h.escape(summary)}</div>',
             tree.to_svg(label, selected, {i for i in on_returned_paths(tree)
                                           if tree[i].step <= step}, static, expanded=expanded,
                         zoom=zoom, interactive=interactive, steps=step) if len(tree) else ""]
    if node_id is not None:
        node = tree[node_id]
        path, walk = [], node
        while walk is not None:
            path.append(walk.text)
            walk = None if walk.parent is None else tree[walk.parent]
        prompt = tree.prompt_text or ""
        parts.append(f'<div class="wb-node" style="margin-top:6px;overflow-wrap:anywhere">node #{node.id}: '
                     f'{h.token_text(prompt)}<b>{h.token_strip(reversed(path))}</b> '
                     f"(cum logprob {h.fmt(node.cum_logprob)}, score {h.fmt(node.score)}, "
                     f"{node.status})</div>")
        parts.append(_candidates(f"alternatives at step {node.step} (same parent)",
                                 tree.children(node.parent), node.id))
        children = tree.children(node.id)
        if children:
            parts.append(_candidates(f"expanded from it at step {node.step + 1}", children, None))
    return f'<div class="wb-beam-step" style="font-family:monospace">{"".join(parts)}</div>'


def check_width(width: int) -> None:
    """Refuses a beam width the explorer does not draw (below 1 or above `MAX_BEAM_WIDTH`)."""
    if not 1 <= width <= MAX_BEAM_WIDTH:
        raise ValidationError(f"beam width must be between 1 and {MAX_BEAM_WIDTH} in the "
                              f"explorer, got {width}.", parameter="beam_width", value=width)


def error_html(exc: BaseException) -> str:
    """An exception in the OpenAI error shape's words: `400 BadRequestError: message (param)`."""
    err = error_response(exc).error
    named = err.param is None or f"parameter={err.param}" in err.message
    param = "" if named else f" (parameter={err.param})"
    return h.error_box(f"{err.code} {h.escape(err.type)}: {h.escape(err.message)}"
                       f"{h.escape(param)}")


class _Ticker:
    """Calls `tick(seconds elapsed)` every `every` seconds from a thread until `stop()`: the
    busy line keeps moving while a search holds the kernel's main thread."""

    def __init__(self, tick: Callable[[float], None], every: float = 1.0):
        self._tick, self._every = tick, every
        self._start, self._done = time.monotonic(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="wb-explorer-ticker")
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self._every):
            self._tick(time.monotonic() - self._start)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


class _WidgetBar:
    """tqdm's `update` / `n` / `close` on an `IntProgress`, shown while it counts."""

    def __init__(self, bar: widgets.IntProgress, total: int, desc: str):
        self.bar, self.n = bar, 0
        bar.max, bar.value, bar.description = max(total, 1), 0, "steps"
        bar.tooltip = desc
        bar.layout.display = None

    def update(self, k: int) -> None:
        self.n += k
        self.bar.value = min(self.n, self.bar.max)

    def close(self) -> None:
        self.bar.layout.display = "none"


class BeamExplorer(widgets.VBox):
    """Beam search, explored: controls, a step slider, a node selector and the HTML view.

    `BeamExplorer(tree=tree)` shows an existing tree; `BeamExplorer(llm, prompt)` runs
    `llm.beam_search` first (and again on Search or Enter in the prompt). `search(prompt, width,
    length_penalty, max_tokens) -> BeamTree` replaces the default search (e.g. a remote
    `Workbench`). While a search runs the button is disabled and a status line says what runs;
    an error is shown in the widget (`status`) and the previous tree stays.
    """

    def __init__(self, llm: Any = None, prompt: str = "", *, tree: BeamTree | None = None,
                 beam_width: int = 4, length_penalty: float = 1.0, max_tokens: int = 16,
                 search: Search | None = None, **kwargs: Any):
        self.llm, self._search = llm, search
        self.prompt = widgets.Text(value=prompt, description="prompt",
                                   layout=widgets.Layout(width="60%"))
        self.beam_width = widgets.IntText(value=beam_width, description="beam width",
                                          layout=widgets.Layout(width="160px"))
        self.length_penalty = widgets.FloatText(value=length_penalty, description="length pen.",
                                                layout=widgets.Layout(width="160px"))
        self.max_tokens = widgets.BoundedIntText(value=max_tokens, min=1, max=256,
                                                 description="max tokens",
                                                 layout=widgets.Layout(width="160px"))
        self.button = widgets.Button(description="Search", icon="search")
        self.status = widgets.HTML()
        self.progress = widgets.IntProgress(value=0, min=0, max=1, description="steps",
                                            layout=widgets.Layout(display="none"))
        compact = {"description_width": "initial", "button_width": "auto"}
        self.label = widgets.ToggleButtons(
            options=[("token logprob", "logprob"), ("cumulative", "cum_logprob"),
                     ("score", "score")], value="cum_logprob", description="numbers",
            style=compact)
        self.zoom = widgets.Dropdown(options=ZOOMS, value=1.0, description="zoom",
                                     layout=widgets.Layout(width="180px"))
        self.pruned = widgets.ToggleButtons(options=["folded", "all"], value="folded",
                                            description="pruned", style=compact)
        self.step = widgets.IntSlider(value=0, min=0, max=0, description="step",
                                      continuous_update=True, layout=widgets.Layout(width="60%"))
        self.node = widgets.Select(options=[], rows=8, description="node",
                                   layout=widgets.Layout(width="60%"))
        self.listed = widgets.ToggleButtons(
            options=[("kept & returned", "kept"), ("all", "all")], value="kept",
            description="list", style=compact)
        self.pick = widgets.Text(layout=widgets.Layout(display="none"))  # the drawing's clicks
        self.pick.add_class("wb-pick")
        self.view = widgets.HTML()
        controls = widgets.HBox([self.beam_width, self.length_penalty, self.max_tokens,
                                 self.button], layout=widgets.Layout(flex_flow="row wrap"))
        display = widgets.HBox([self.label, self.zoom, self.pruned],
                               layout=widgets.Layout(flex_flow="row wrap"))
        listing = widgets.HBox([self.node, self.listed])
        super().__init__(children=[self.prompt, controls, self.status, self.progress, display,
                                   self.step, listing, self.pick, self.view],
                         **kwargs)
        self.add_class("wb-explorer")
        self.tree: BeamTree | None = None
        self.expanded: set[int | None] = set()  # parents whose pruned candidates are drawn
        self.button.on_click(lambda _: self.run(raise_errors=False))
        self.prompt.on_msg(self._on_prompt_msg)
        self.beam_width.observe(self._on_width, names="value")
        self.step.observe(self._on_step, names="value")
        self.listed.observe(lambda _: self._list(), names="value")
        self.pick.observe(self._on_pick, names="value")
        for control in (self.node, self.label, self.zoom, self.pruned):
            control.observe(self._on_node, names="value")
        if tree is not None:
            self.show(tree)
        elif llm is not None or search is not None:
            self.run()

    # -- actions -----------------------------------------------------------------------------
    def run(self, raise_errors: bool = True) -> BeamTree | None:
        """Runs the search with the current controls and shows the result; on an error the
        widget shows it (and raises it unless `raise_errors` is false: the button)."""
        search = self._search or self._llm_search
        prompt, width = self.prompt.value, self.beam_width.value
        penalty, max_tokens = self.length_penalty.value, self.max_tokens.value
        line = (f"searching: beam width {width}, up to {max_tokens} tokens, length penalty "
                f"{penalty:g} …")
        self._busy(line)
        ticker = _Ticker(lambda s: self._busy(f"{line} {s:.0f} s elapsed"))
        try:
            check_width(width)
            tree = search(prompt, width, penalty, max_tokens)
        except Exception as exc:  # shown in the widget: a button's handler has nowhere to raise
            ticker.stop()
            self._idle(error_html(exc))
            if raise_errors:
                raise
            return None
        ticker.stop()
        self.show(tree)  # the new tree first, then the button comes back
        self._idle("")
        return tree
    def _busy(self, line: str) -> None:
        self.button.disabled, self.button.description = True, "Searching…"
        self.button.icon = "spinner"
        self.status.value = f'<div class="wb-busy" style="font-style:italic">{h.escape(line)}</div>'
        if not self.view.value.startswith('<div class="wb-dimmed"'):  # the old tree stays, dimmed
            self.view.value = f'<div class="wb-dimmed" style="opacity:0.45">{self.view.value}</div>'

    def _idle(self, status: str) -> None:
        self.button.disabled, self.button.description, self.button.icon = False, "Search", "search"
        self.status.value = status
        self._render()

    def _llm_search(self, prompt: str, width: int, length_penalty: float, max_tokens: int
                    ) -> BeamTree:
        params = BeamSearchParams(beam_width=width, max_tokens=max_tokens,
                                  length_penalty=length_penalty)
        return self.llm.beam_search([prompt], params, use_tqdm=self._progress_bar)[0].tree

    def _progress_bar(self, total: int, desc: str) -> "_WidgetBar":
        """The search's progress (engine steps) in the widget's own bar (`use_tqdm`)."""
        return _WidgetBar(self.progress, total, desc)

    def show(self, tree: BeamTree) -> None:
        """Displays `tree` at its last step, best node selected; the controls are set from the
        tree, so Search unchanged runs the same search."""
        self.tree, self.expanded = tree, set()
        if tree.prompt_text is not None:
            self.prompt.value = tree.prompt_text
        self.beam_width.value, self.length_penalty.value = tree.beam_width, tree.length_penalty
        if tree.num_steps:
            self.max_tokens.value = tree.num_steps
        self.step.max = tree.num_steps  # may clamp the value, which redraws: harmless
        self.step.min = min(1, tree.num_steps)  # step 0 would be the prompt alone
        if self.step.value == tree.num_steps:
            self._on_step({"new": tree.num_steps})  # no change event when the value stays
        else:
            self.step.value = tree.num_steps

    # -- reactions ---------------------------------------------------------------------------
    def _on_prompt_msg(self, _: Any, content: dict, buffers: Any) -> None:
        """Enter in the prompt box (the text box's `submit` event) searches."""
        if content.get("event") == "submit" and not self.button.disabled:
            self.run(raise_errors=False)

    def _on_width(self, change: dict) -> None:
        """Says at once when the beam width is out of range (Search would refuse it)."""
        try:
            check_width(change["new"])
        except ValidationError as exc:
            self.status.value = error_html(exc)
        else:
            if 'class="wb-error"' in self.status.value:
                self.status.value = ""

    def _on_step(self, change: dict) -> None:
        """Lists the step's candidates; selects the one on a returned path, else a kept one."""
        nodes = self.tree.step(change["new"]) if self.tree else []
        on_path = on_returned_paths(self.tree) if self.tree else set()
        default = next((n.id for n in nodes if n.id in on_path),
                       next((n.id for n in nodes if n.status != "pruned"), None))
        self._list(default)

    def _list(self, selected: int | None = None) -> None:
        """The node selector: the step's kept, completed and returned candidates (`listed`:
        or all of them), and the selected one; then redraws."""
        selected = self.node.value if selected is None else selected
        nodes = self.tree.step(self.step.value) if self.tree else []
        if self.listed.value == "kept":
            on_path = on_returned_paths(self.tree) if self.tree else set()
            nodes = [n for n in nodes if n.status != "pruned" or n.id in on_path]
        if self.tree and selected is not None and all(n.id != selected for n in nodes):
            nodes.append(self.tree[selected])  # picked in the drawing: of another step, pruned
        self.node.unobserve(self._on_node, names="value")
        self.node.options = [(node_label(n), n.id) for n in nodes]
        self.node.value = selected if any(n.id == selected for n in nodes) else None
        self.node.observe(self._on_node, names="value")
        self._render()

    def _on_pick(self, change: dict) -> None:
        """A click in the drawing: a node id selects that node (the drawing stays at its step,
        the list adds the node); `+parent` (`+`: the prompt) folds or unfolds that parent's
        pruned candidates."""
        value = change["new"]
        if not value or self.tree is None:
            return
        self.pick.value = ""  # the same node can be clicked again
        if value.startswith("+"):
            parent = int(value[1:]) if value[1:] else None
            self.expanded ^= {parent}
            self._render()
            return
        self._list(int(value))

    def _on_node(self, change: dict) -> None:
        self._render()

    def _render(self) -> None:
        self.view.value = self.to_html(static=False)

    def to_html(self, static: bool = True) -> str:
        """The current step and node as static HTML (where widgets don't render; `static`
        adds the drawing's picture copy for untrusted notebooks)."""
        if self.tree is None:
            return '<div class="wb-beam-step">no search yet</div>'
        expanded = True if self.pruned.value == "all" else self.expanded
        return render_step(self.tree, self.step.value, self.node.value, self.label.value,
                           static, expanded=expanded, zoom=self.zoom.value or None,
                           interactive=not static)

    def _repr_html_(self) -> str:
        return self.to_html()
