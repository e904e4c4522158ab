"""The beam tree's SVG: its own scrolling box, folded pruned candidates, edges that never cross a
label, visible whitespace, both themes' palettes, the explorer's clicks."""

from __future__ import annotations

import re

import pytest

from tests.inspect.contrast import contrast
from workbench.inspect import beam_svg
from workbench.inspect.beam_tree import BeamNode, BeamTree


@pytest.fixture
def tree() -> BeamTree:
    return BeamTree([1], beam_width=2, length_penalty=1.0, prompt_text="Hi", nodes=[
        BeamNode(0, 1, 5, "a", -0.1, -0.1, None, 1, "kept", -0.05),
        BeamNode(1, 1, 6, " internationalisation", -2.0, -2.0, None, 2, "kept", -1.0),
        BeamNode(2, 2, 7, "c", -0.2, -0.3, 0, 1, "completed", -0.15),
        BeamNode(3, 2, 8, "d", -0.5, -0.6, 0, 2, "pruned", -0.3)], returned=[2])


def wide_tree(width: int, steps: int) -> BeamTree:
    """A search's shape: each step expands every kept beam into 2 x width candidates, the best
    `width` of them kept (its own first ranks); the best last one returned."""
    nodes: list[BeamNode] = []
    beams: list[int | None] = [None]
    for step in range(1, steps + 1):
        children = []
        for b, parent in enumerate(beams):
            base = 0.0 if parent is None else nodes[parent].cum_logprob
            for rank in range(1, 2 * width + 1):
                lp = -0.1 * rank - 0.01 * b
                children.append((base + lp, parent, rank, lp))
        children.sort(reverse=True)
        beams = []
        for i, (cum, parent, rank, lp) in enumerate(children):
            status = "kept" if i < width else "pruned"
            node = BeamNode(len(nodes), step, 100 + rank, f" tok{step}.{rank}", lp, cum, parent,
                            rank, status, cum / step)
            nodes.append(node)
            if status == "kept":
                beams.append(node.id)
    return BeamTree([1], width, 1.0, nodes, [beams[0]], prompt_text="Hi")


def _labels(html: str) -> list[tuple[str, float, float, float]]:
    """(text, x, y, drawn width) of each label."""
    return [(m.group(4), float(m.group(1)), float(m.group(2)), float(m.group(3))) for m in
            re.finditer(r'<text class="wb-label" x="([\d.]+)" y="([\d.]+)" textLength="([\d.]+)"'
                        r'[^>]*>([^<]*)</text>', html)]


def _edges(html: str) -> list[list[tuple[float, float]]]:
    """Each edge as points along it: the stub, then the curve sampled."""
    out = []
    for d in re.findall(r'<path class="wb-edge" d="([^"]+)"', html):
        x0, y0, stub, c1x, c1y, c2x, c2y, x3, y3 = map(float, re.findall(r"[\d.]+", d))
        points = [(x0 + (stub - x0) * t / 20, y0) for t in range(21)]
        for i in range(41):
            t = i / 40
            points.append((
                (1 - t) ** 3 * stub + 3 * (1 - t) ** 2 * t * c1x + 3 * (1 - t) * t ** 2 * c2x
                + t ** 3 * x3,
                (1 - t) ** 3 * y0 + 3 * (1 - t) ** 2 * t * c1y + 3 * (1 - t) * t ** 2 * c2y
                + t ** 3 * y3))
        out.append(points)
    return out


def test_the_drawing_scrolls_in_its_own_box_of_the_outputs_width(tree):
    html = tree.to_svg()
    width, height = map(int, re.search(r'viewBox="0 0 (\d+) (\d+)"', html).groups())
    assert f'width="{width}" height="{height}"' in html
    # width:0 + min-width:100%: the box never widens its parent (a widget's HTML), it scrolls
    assert html.startswith('<div class="wb-drawing" style="overflow:auto;width:0;min-width:100%;')
    assert "max-width:100%" in html and "height:auto" in html  # fitted by default


def test_zoom_sets_the_drawn_size(tree):
    fitted = tree.to_svg()
    width, height = map(int, re.search(r'viewBox="0 0 (\d+) (\d+)"', fitted).groups())
    zoomed = tree.to_svg(zoom=1.5)
    assert f'width="{round(width * 1.5)}" height="{round(height * 1.5)}"' in zoomed
    assert "max-width:none" in zoomed and "max-width:100%" not in zoomed


def test_legend_names_every_colour_and_the_number_shown(tree):
    legend = re.search(r'<g class="wb-legend">(.*?)</g>', tree.to_svg()).group(1)
    for name in ("kept", "pruned", "completed (EOS)", "returned path"):
        assert f">{name}<" in legend
    assert ">numbers: cumulative logprob; ▸ +N: pruned, folded<" in legend
    assert ">numbers: score (length-penalised); " in tree.to_svg(label="score")


def test_pruned_candidates_fold_into_a_count_per_parent():
    wide = wide_tree(4, 3)
    html = wide.to_svg(highlight=[])
    drawn = [t for t, *_ in _labels(html)]
    assert sum(t.startswith("▸ +") for t in drawn) == 1 + 4 + 4  # the prompt, then 4 beams
    assert "▸ +4 pruned" in drawn  # the prompt's 8 candidates, 4 kept
    assert sum(n.status == "kept" for n in wide) == sum(t.startswith("␣tok") for t in drawn)
    every = wide.to_svg(expanded=True)
    assert "pruned<" not in every.replace(">pruned<", "")  # no folds, the legend's word only
    assert every.count('<g class="wb-candidate"') == len(wide)
    one = wide.to_svg(expanded=[None], highlight=[])  # the prompt's candidates unfolded
    assert "▾ 4 pruned" in [t for t, *_ in _labels(one)]
    assert one.count('<g class="wb-candidate"') == html.count('<g class="wb-candidate"') + 4


def test_returned_paths_and_the_selection_are_never_folded():
    wide = wide_tree(3, 3)
    pruned = next(n for n in wide if n.status == "pruned" and n.step == 2)
    html = wide.to_svg(selected=pruned.id)
    assert f'data-pick="{pruned.id}"><rect class="wb-selected"' in html
    for n in wide.path(0):
        assert f'data-pick="{n.id}"' in html


@pytest.mark.parametrize("shape", [(2, 3), (5, 4), (16, 4)])
def test_edges_leave_from_the_columns_right_edge_and_cross_no_label(shape):
    wide = wide_tree(*shape)
    html = wide.to_svg(expanded=True, highlight=[])
    assert len(_edges(html)) == len(wide)  # one per node
    columns: dict[float, list[tuple[float, float, float]]] = {}  # a column's x: its labels
    for _, x, y, w in _labels(html):
        columns.setdefault(x, []).append((x + w, y - 11, y + 3))
    starts = sorted(columns)
    for points in _edges(html):
        for px, py in points:
            column = max((x for x in starts if x <= px), default=None)
            hit = [b for b in columns.get(column, []) if px < b[0] and b[1] < py < b[2]]
            assert not hit, (px, py, column, hit)
        # the curve starts right of every label of its column
        start = points[21][0]
        column = max(x for x in starts if x < start)
        assert all(start > right for right, *_ in columns[column])


def test_whitespace_tokens_are_visible_marks_with_the_raw_token_on_hover():
    tree = BeamTree([1], 1, 1.0, [BeamNode(0, 1, 5, " ", -0.1, -0.1, None, 1, "kept", -0.1),
                                  BeamNode(1, 2, 6, "\n\n", -0.2, -0.3, 0, 1, "kept", -0.15)], [1])
    html = tree.to_svg()
    texts = [t for t, *_ in _labels(html)]
    assert "␣ -0.10" in texts and "⏎⏎ -0.30" in texts
    assert "<title>&#x27; &#x27;: step 1" in html and "<title>&#x27;\\n\\n&#x27;: step 2" in html


def test_long_tokens_are_ellipsised_with_the_full_text_on_hover(tree):
    html = tree.to_svg()
    assert ">␣internatio… -2.00<" in html
    assert "<title>&#x27; internationalisation&#x27;: step 1, rank 2, kept" in html


def test_selected_node_is_marked_and_returned_paths_drawn(tree):
    html = tree.to_svg(selected=3)
    assert re.search(r'data-pick="3"><rect class="wb-selected"[^>]*/><title>&#x27;d&#x27;', html)
    returned = f'style="stroke:{beam_svg.colour("returned")}" stroke-width="2.5"'
    assert html.count(returned) == 1 + 2  # the legend, a and c
    assert tree.to_svg(highlight=[]).count('stroke-width="2.5"') == 1  # the legend's only


def test_only_the_interactive_drawing_takes_clicks(tree):
    assert "onclick" not in tree.to_svg() and "onerror" not in tree._repr_html_()
    live = tree.to_svg(interactive=True)
    assert ".wb-pick input" in live and "data-pick" in live
    assert "onscroll" in live and "onerror" in live  # keeps its scroll, shows the selection


@pytest.mark.parametrize("theme", [0, 1])  # light, dark
def test_every_colour_reads_on_its_palettes_background(theme):
    background = beam_svg.PALETTE["background"][theme]
    for name in ("kept", "completed", "pruned", "returned", "ink"):
        assert contrast(beam_svg.PALETTE[name][theme], background) >= 4.5, name
        assert contrast(beam_svg.PALETTE[name][theme],
                        beam_svg.PALETTE["selected"][theme]) >= 4.5, name


def test_colours_are_theme_variables_with_a_dark_palette(tree):
    html = tree.to_svg()
    assert not re.search(r'(fill|stroke)="#', html)  # every colour through a variable
    assert "fill:var(--wb-kept,#1a5e9a)" in html
    assert "body[data-jp-theme-light='false'] .wb-drawing{--wb-kept:#8ab4f8;" in html


def test_an_unknown_label_is_refused(tree):
    with pytest.raises(ValueError, match="label must be one of"):
        tree.to_svg(label="prob")


def test_html_has_a_picture_copy_for_untrusted_notebooks(tree):
    import base64

    html = tree._repr_html_()
    live = tree.to_svg()
    svg = re.search(r"<svg.*</svg>", live).group()
    data = re.search(r'<img [^>]*src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', html).group(1)
    assert base64.b64decode(data).decode() == svg  # the same drawing, as a picture
    key = re.match(r'<div class="(wb-fallback-[0-9a-f]{10})">', html).group(1)
    # untrusted: <style> is stripped, inline display stays: picture shown, live SVG hidden
    assert '<div class="wb-static" style="display:block">' in html
    assert f'<div class="wb-live" style="display:none">{live}</div>' in html
    # trusted: the style swaps them
    assert (f"<style>.{key} .wb-static{{display:none !important}}"
            f".{key} .wb-live{{display:block !important}}</style>") in html
