"""A beam search's tree (`workbench.engine.requests.beam_tree`) drawn as self-contained inline SVG.

Columns are steps, rows the candidates drawn at a step, grouped under their parent (`rows`).
Pruned candidates are folded: one `+N pruned` row per parent, unfolded for the parents in
`expanded` (True: all); kept and completed nodes, the returned paths and `keep` are always
drawn. Each label is the token (whitespace as visible marks, ellipsised past `MAX_CHARS`; the
raw text and the numbers on hover) and one number (`label`). An edge leaves from its column's
right edge (a stub extends the parent's label to it) and curves into the child inside the gap
between columns, so no edge crosses a label. Colours are CSS variables: a light palette as
fallback (the picture copy), a dark one where JupyterLab's theme is dark. The drawing scrolls in
its own box at `zoom` (None: scaled to the box, down to `MIN_SCALE`); its id is a content hash.
Takes the engine's plain `BeamTreeData`, so it does not depend on `inspect.beam_tree`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from workbench.display import html as h
from workbench.engine.requests.beam_tree import BeamNode, BeamTreeData

# name -> (light, dark); each colour >= 4.5:1 on its palette's background and selection
PALETTE = {"kept": ("#1a5e9a", "#8ab4f8"), "completed": ("#1e7b34", "#81c995"),
           "pruned": ("#666666", "#a8a8a8"), "returned": ("#c62828", "#ff8a80"),
           "ink": ("#222222", "#e6e6e6"), "background": ("#ffffff", "#111111"),
           "selected": ("#fff1a8", "#3b3300")}
COLOURS = {k: PALETTE[k][0] for k in ("kept", "completed", "pruned", "returned")}
BACKGROUND, SELECTED = PALETTE["background"][0], PALETTE["selected"][0]
LABELS = {"logprob": "token logprob", "cum_logprob": "cumulative logprob",
          "score": "score (length-penalised)"}
MAX_CHARS = 12  # token characters shown before an ellipsis
CHAR_W, ROW_H, GAP, PAD, LEGEND_H = 6.7, 18, 40, 10, 24  # px; CHAR_W: 11px monospace
MIN_SCALE = 0.6  # fitted: scaled down to at most this, then the drawing scrolls
BOX = "overflow:auto;width:0;min-width:100%;max-height:75vh"  # width:0: never widens its parent


def colour(name: str) -> str:
    """CSS for a palette colour: the theme's variable, the light colour as fallback."""
    return f"var(--wb-{name},{PALETTE[name][0]})"


# the dark palette, where JupyterLab says its theme is dark (the picture copy keeps the fallback)
THEME_CSS = ("<style>body[data-jp-theme-light='false'] .wb-drawing{"
             + "".join(f"--wb-{k}:{dark};" for k, (_, dark) in PALETTE.items() if k != "background")
             + "--wb-background:var(--jp-layout-color0,#111111)}</style>")


@dataclass(frozen=True)
class Fold:
    """A parent's pruned candidates as one row: `count` of them, `open` if drawn too."""

    parent: int | None
    step: int
    count: int
    open: bool


def rows(tree: BeamTreeData, keep: Collection[int] = (),
         expanded: Collection[int | None] | bool = (),
         steps: int | None = None) -> list[list[BeamNode | Fold]]:
    """Per step (index 0 = step 1, up to `steps`) its rows, top to bottom: parents in their own
    rows' order, each parent's drawn children by rank, then a `Fold` of its pruned ones."""
    keep = set(keep)
    by_step: dict[int, dict[int | None, list[BeamNode]]] = {}
    for n in tree.nodes:
        by_step.setdefault(n.step, {}).setdefault(n.parent, []).append(n)
    order: dict[int | None, int] = {None: 0}
    out: list[list[BeamNode | Fold]] = []
    for s in range(1, (tree.num_steps if steps is None else steps) + 1):
        groups, column = by_step.get(s, {}), []
        for parent in sorted(groups, key=lambda p: order.get(p, 0)):
            children = sorted(groups[parent], key=lambda n: n.rank)
            opened = expanded is True or (expanded is not False and parent in expanded)
            column += [n for n in children if opened or n.status != "pruned" or n.id in keep]
            pruned = [n for n in children if n.status == "pruned"]
            folded = len(pruned) if opened else sum(n.id not in keep for n in pruned)
            if expanded is not True and folded:
                column.append(Fold(parent, s, folded, opened))
        order.update({r.id: y for y, r in enumerate(column) if isinstance(r, BeamNode)})
        out.append(column)
    return out


def layout(tree: BeamTreeData, keep: Collection[int] = (),
           expanded: Collection[int | None] | bool = True) -> dict[int | None, tuple[float, float]]:
    """(x, y) of each drawn node id (None = the prompt): x its step, y its row (`rows`)."""
    pos: dict[int | None, tuple[float, float]] = {None: (0.0, 0.0)}
    for column in rows(tree, keep, expanded):
        pos.update({r.id: (float(r.step), float(y)) for y, r in enumerate(column)
                    if isinstance(r, BeamNode)})
    return pos


def short_token(text: str) -> str:
    """A token as a label: visible marks for whitespace (`html.visible`), ellipsised."""
    shown = h.visible(text)
    return shown if len(shown) <= MAX_CHARS else shown[:MAX_CHARS - 1] + "…"


def _label(row: BeamNode | Fold, label: str) -> str:
    if isinstance(row, Fold):
        return f"▾ {row.count} pruned" if row.open else f"▸ +{row.count} pruned"
    return f"{short_token(row.text)} {h.fmt(getattr(row, label), 2)}"


def _text_w(text: str) -> float:
    return CHAR_W * len(text)


LEGEND = (("kept", "kept"), ("pruned", "pruned"), ("completed", "completed (EOS)"),
          ("returned", "returned path"))


def _legend(label: str) -> str:
    x, parts = float(PAD), []
    for key, name in LEGEND:
        width = 2.5 if key == "returned" else 1.5
        parts.append(f'<line x1="{x}" y1="{PAD + 6}" x2="{x + 16}" y2="{PAD + 6}" '
                     f'style="stroke:{colour(key)}" stroke-width="{width}"/>'
                     f'<text x="{x + 20}" y="{PAD + 10}" font-size="11" '
                     f'style="fill:{colour(key)}">{h.escape(name)}</text>')
        x += 28 + _text_w(name)
    parts.append(f'<text x="{x + 8:.1f}" y="{PAD + 10}" font-size="11" style="fill:'
                 f'{colour("ink")}">numbers: {h.escape(LABELS[label])}; ▸ +N: pruned, folded'
                 f"</text>")
    return f'<g class="wb-legend">{"".join(parts)}</g>'


def legend_width(label: str) -> float:
    return (PAD + sum(28 + _text_w(n) for _, n in LEGEND) + 8
            + _text_w(f"numbers: {LABELS[label]}; ▸ +N: pruned, folded"))


# interactive: a click posts the node id (a fold: "+parent") to the explorer's hidden `.wb-pick`
# text box; the box remembers its scroll position across redraws and brings the selection into view
_PICK = ("var g=event.target.closest('[data-pick]'),r=this.closest('.wb-explorer'),"
         "i=r&&r.querySelector('.wb-pick input');if(g&&i){i.value=g.getAttribute('data-pick');"
         "i.dispatchEvent(new Event('change',{bubbles:true}))}")
_KEEP_SCROLL = ("var r=this.closest('.wb-explorer');if(r)r.wbScroll=[this.scrollLeft,"
                "this.scrollTop]")
_RESTORE = ("var b=this.parentNode,r=b.closest('.wb-explorer'),s=r&&r.wbScroll,"
            "t=b.querySelector('.wb-selected');if(s){b.scrollLeft=s[0];b.scrollTop=s[1]}"
            "if(t){var o=b.getBoundingClientRect(),q=t.getBoundingClientRect();"
            "if(q.left<o.left||q.right>o.right)b.scrollLeft+=q.left-o.left-o.width/2;"
            "if(q.top<o.top||q.bottom>o.bottom)b.scrollTop+=q.top-o.top-o.height/2}")


def _title(n: BeamNode) -> str:
    return (f"{n.text!r}: step {n.step}, rank {n.rank}, {n.status}, logprob {h.fmt(n.logprob)}, "
            f"cumulative {h.fmt(n.cum_logprob)}, score {h.fmt(n.score)}")


def draw(tree: BeamTreeData, label: str = "cum_logprob", selected: int | None = None,
         highlight: Collection[int] | None = None, static: bool = False, *,
         expanded: Collection[int | None] | bool = (), zoom: float | None = None,
         interactive: bool = False, steps: int | None = None) -> str:
    """The SVG in its scrolling box (module docstring). `highlight`: node ids drawn as returned
    paths (default: the tree's own); `selected`: a node id marked in yellow; `expanded`: the
    parents (None: the prompt) whose pruned candidates are drawn, True: all; `static`: with a
    picture copy for untrusted notebooks (`html.static_fallback`); `interactive`: clicks pick
    nodes in a `BeamExplorer`; `steps`: only steps 1..steps drawn (node ids unchanged)."""
    if label not in LABELS:
        raise ValueError(f"label must be one of {sorted(LABELS)}, got {label!r}")
    on_path = set(highlight) if highlight is not None else {
        n.id for i in range(len(tree.returned)) for n in tree.path(i)}
    keep = on_path | ({selected} if selected is not None else set())
    columns = rows(tree, keep, expanded, steps)
    texts = [[_label(r, label) for r in column] for column in columns]
    widths = [_text_w("prompt")] + [max(map(_text_w, t), default=0.0) for t in texts]
    xs = [float(PAD)]
    for w in widths[:-1]:
        xs.append(xs[-1] + w + GAP)
    width = round(max(xs[-1] + widths[-1] + PAD, legend_width(label) + PAD))
    height = round(PAD * 2 + LEGEND_H + ROW_H * max(map(len, columns), default=1))
    top = PAD + LEGEND_H
    where: dict[int | None, tuple[int, str]] = {None: (0, "prompt")}  # row, label
    edges: list[tuple[bool, str]] = []
    labels = []
    for s, (column, column_texts) in enumerate(zip(columns, texts), start=1):
        for y, (r, text) in enumerate(zip(column, column_texts)):
            if isinstance(r, BeamNode):
                where[r.id] = (y, text)
            py, ptext = where[r.parent]
            x1, stub = xs[s - 1] + _text_w(ptext) + 3, xs[s - 1] + widths[s - 1] + 3
            x2, y1, y2 = xs[s] - 3, top + py * ROW_H + 9, top + y * ROW_H + 9
            mid = (stub + x2) / 2
            dash = ' stroke-dasharray="3 3"' if isinstance(r, Fold) else ""
            returned = isinstance(r, BeamNode) and r.id in on_path
            key = "returned" if returned else ("pruned" if isinstance(r, Fold) else r.status)
            edges.append((returned, (
                f'<path class="wb-edge" d="M{x1:.1f},{y1:.1f}H{stub:.1f}C{mid:.1f},{y1:.1f} '
                f'{mid:.1f},{y2:.1f} {x2:.1f},{y2:.1f}" fill="none" style="stroke:{colour(key)}"'
                f' stroke-width="{2.5 if returned else 1}"{dash}/>')))
            labels.append(_node(r, text, xs[s], top + y * ROW_H, returned,
                                isinstance(r, BeamNode) and r.id == selected))
    prompt = (f'<g><title>{h.escape(tree.prompt_text or "the prompt")}</title><text '
              f'class="wb-label" x="{PAD:.1f}" y="{top + 13:.1f}" textLength="{_text_w("prompt"):.1f}" '
              f'lengthAdjust="spacingAndGlyphs" font-size="11" style="fill:{colour("ink")}">'
              f"prompt</text></g>")
    body = (f'{_legend(label)}{"".join(e for r, e in edges if not r)}'
            f'{"".join(e for r, e in edges if r)}{prompt}{"".join(labels)}')
    svg_id = h.content_id("wb-beamtree", body, zoom)
    size = ("max-width:100%;min-width:{}px;height:auto".format(round(width * MIN_SCALE))
            if zoom is None else "max-width:none")
    shown_w, shown_h = (width, height) if zoom is None else (round(width * zoom),
                                                             round(height * zoom))
    click = f' onclick="{h.escape(_PICK)}"' if interactive else ""
    svg = (f'<svg id="{svg_id}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} '
           f'{height}" width="{shown_w}" height="{shown_h}"{click} style="font-family:monospace;'
           f'{size};background:{colour("background")};color:{colour("ink")}"><rect '
           f'width="{width}" height="{height}" style="fill:{colour("background")}"/>{body}</svg>')
    scroll = (f' onscroll="{h.escape(_KEEP_SCROLL)}"' if interactive else "")
    restore = (f'<img alt="" src="data:," hidden onerror="{h.escape(_RESTORE)}"/>'
               if interactive else "")
    live = f'<div class="wb-drawing" style="{BOX}"{scroll}>{THEME_CSS}{svg}{restore}</div>'
    if not static:
        return live
    return h.static_fallback(live, svg, width, height, svg_id.replace("beamtree", "fallback"))


def _node(r: BeamNode | Fold, text: str, x: float, y: float, returned: bool,
          selected: bool) -> str:
    """One row's label: the text (its drawn width fixed, so edges never reach into it), the
    hover title and, if selected, the yellow mark."""
    w = _text_w(text)
    if isinstance(r, Fold):
        owner = "the prompt" if r.parent is None else f"node #{r.parent}"
        title = (f"{r.count} pruned candidates of {owner} at step {r.step}; click to "
                 f"{'fold' if r.open else 'show'} them")
        pick = "+" if r.parent is None else f"+{r.parent}"
        cls, key, weight = "wb-fold", "pruned", "normal"
    else:
        title, pick, cls = _title(r), str(r.id), "wb-candidate"
        key, weight = r.status, "bold" if returned else "normal"
    mark = (f'<rect class="wb-selected" x="{x - 2:.1f}" y="{y + 1:.1f}" width="{w + 4:.1f}" '
            f'height="{ROW_H - 2}" rx="3" style="fill:{colour("selected")};stroke:'
            f'{colour("ink")}"/>' if selected else "")
    return (f'<g class="{cls}" data-pick="{pick}">{mark}<title>{h.escape(title)}</title><text '
            f'class="wb-label" x="{x:.1f}" y="{y + 13:.1f}" textLength="{w:.1f}" '
            f'lengthAdjust="spacingAndGlyphs" font-size="11" font-weight="{weight}" '
            f'style="fill:{colour(key)}">{h.escape(text)}</text></g>')
