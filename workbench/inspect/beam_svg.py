"""A `BeamTree` drawn as self-contained inline SVG.

Columns are steps, rows the candidates of a step (children near their parent). Each label is
the token (ellipsised past `MAX_CHARS`, full text and numbers on hover) and one number: the
token's logprob, the cumulative logprob or the length-penalised score (`label`). Edges join the
end of the parent's label to the start of the child's. A legend inside the drawing names the
colours and the number shown. The drawing has its own white background and colours with at
least 4.5:1 contrast on it, a `viewBox` so it scales down to its output area (to `MIN_SCALE`,
then scrolls inside its own box), and an id from a content hash.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from workbench import html as h

if TYPE_CHECKING:
    from workbench.inspect.beam_tree import BeamNode, BeamTree

COLOURS = {"kept": "#1a5e9a", "completed": "#1e7b34", "pruned": "#666666",
           "returned": "#c62828"}  # each >= 4.5:1 on the white background
BACKGROUND, SELECTED = "#ffffff", "#ffe97a"
LABELS = {"logprob": "token logprob", "cum_logprob": "cumulative logprob",
          "score": "score (length-penalised)"}
MAX_CHARS = 12  # token characters shown before an ellipsis
CHAR_W, ROW_H, GAP, PAD, LEGEND_H = 6.7, 18, 26, 10, 24  # px; CHAR_W: 11px monospace
MIN_SCALE = 0.6  # scaled down to at most this, then the drawing scrolls


def short_token(text: str) -> str:
    """A token as a label: escapes for newlines and tabs, ellipsised past MAX_CHARS."""
    shown = text.replace("\n", "\\n").replace("\t", "\\t")
    return shown if len(shown) <= MAX_CHARS else shown[:MAX_CHARS - 1] + "…"


def _label(node: "BeamNode", label: str) -> str:
    return f"{short_token(node.text)} {h.fmt(getattr(node, label), 2)}"


def _text_w(text: str) -> float:
    return CHAR_W * len(text)


def _legend(label: str) -> str:
    items, x, parts = (("kept", "kept"), ("pruned", "pruned"), ("completed", "completed (EOS)"),
                       ("returned", "returned path")), PAD, []
    for key, name in items:
        width = 2.5 if key == "returned" else 1.5
        parts.append(f'<line x1="{x}" y1="{PAD + 6}" x2="{x + 16}" y2="{PAD + 6}" '
                     f'stroke="{COLOURS[key]}" stroke-width="{width}"/>'
                     f'<text x="{x + 20}" y="{PAD + 10}" font-size="11" '
                     f'fill="{COLOURS[key]}">{h.escape(name)}</text>')
        x += 28 + _text_w(name)
    parts.append(f'<text x="{x + 8:.1f}" y="{PAD + 10}" font-size="11" fill="#222222">'
                 f'numbers: {h.escape(LABELS[label])}</text>')
    return f'<g class="wb-legend">{"".join(parts)}</g>'


def legend_width(label: str) -> float:
    names = ("kept", "pruned", "completed (EOS)", "returned path")
    return PAD + sum(28 + _text_w(n) for n in names) + 8 + _text_w("numbers: " + LABELS[label])


def draw(tree: "BeamTree", label: str = "cum_logprob", selected: int | None = None,
         highlight: Collection[int] | None = None, static: bool = False) -> str:
    """The SVG (see the module docstring); `highlight`: node ids drawn as returned paths
    (default: the tree's own returned paths); `selected`: a node id marked in yellow;
    `static`: with a picture copy for untrusted notebooks (`html.static_fallback`)."""
    if label not in LABELS:
        raise ValueError(f"label must be one of {sorted(LABELS)}, got {label!r}")
    pos = tree.layout()
    on_path = set(highlight) if highlight is not None else {
        n.id for i in range(len(tree.returned)) for n in tree.path(i)}
    col_w = max((_text_w(_label(n, label)) for n in tree.nodes), default=0) + GAP
    col_w = max(col_w, _text_w("prompt") + GAP)
    rows = max((y for _, y in pos.values()), default=0) + 1
    width = round(max(PAD * 2 + col_w * (tree.num_steps + 1), legend_width(label) + PAD))
    height = round(PAD * 2 + LEGEND_H + ROW_H * rows)

    def xy(node_id: int | None) -> tuple[float, float]:
        x, y = pos[node_id]
        return PAD + x * col_w, PAD + LEGEND_H + y * ROW_H

    ends = {None: xy(None)[0] + _text_w("prompt") + 3}
    ends.update({n.id: xy(n.id)[0] + _text_w(_label(n, label)) + 3 for n in tree.nodes})
    edges, labels = [], []
    for n in tree.nodes:
        (_, y1), (x2, y2) = xy(n.parent), xy(n.id)
        returned = n.id in on_path
        edges.append(f'<line x1="{ends[n.parent]:.1f}" y1="{y1 + 9:.1f}" x2="{x2 - 3:.1f}" '
                     f'y2="{y2 + 9:.1f}" stroke="{COLOURS["returned" if returned else n.status]}"'
                     f' stroke-width="{2.5 if returned else 1}"/>')
        title = (f"{n.text!r}: step {n.step}, rank {n.rank}, {n.status}, logprob "
                 f"{h.fmt(n.logprob)}, cumulative {h.fmt(n.cum_logprob)}, score {h.fmt(n.score)}")
        mark = ""
        if n.id == selected:
            mark = (f'<rect class="wb-selected" x="{x2 - 2:.1f}" y="{y2 + 1:.1f}" '
                    f'width="{ends[n.id] - x2 + 1:.1f}" height="{ROW_H - 2}" rx="3" '
                    f'fill="{SELECTED}" stroke="#222222"/>')
        labels.append(f'<g>{mark}<title>{h.escape(title)}</title><text x="{x2:.1f}" '
                      f'y="{y2 + 13:.1f}" font-size="11" font-weight="'
                      f'{"bold" if returned else "normal"}" fill="{COLOURS[n.status]}">'
                      f'{h.escape(_label(n, label))}</text></g>')
    px, py = xy(None)
    prompt = (f'<g><title>{h.escape(tree.prompt_text or "the prompt")}</title><text x="{px:.1f}" '
              f'y="{py + 13:.1f}" font-size="11" fill="#222222">prompt</text></g>')
    svg_id = h.content_id("wb-beamtree", tree.to_dict(), label, selected,
                          sorted(on_path))
    svg = (f'<svg id="{svg_id}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} '
           f'{height}" width="{width}" height="{height}" style="font-family:monospace;'
           f'max-width:100%;min-width:{round(width * MIN_SCALE)}px;height:auto;'
           f'background:{BACKGROUND};color:#222222"><rect width="{width}" height="{height}" '
           f'fill="{BACKGROUND}"/>{_legend(label)}{"".join(edges)}{prompt}{"".join(labels)}'
           f"</svg>")
    live = f'<div class="wb-drawing" style="overflow-x:auto;max-width:100%">{svg}</div>'
    if not static:
        return live
    return h.static_fallback(live, svg, width, height, svg_id.replace("beamtree", "fallback"))
