"""The beam tree's SVG: fits its box, explains itself (legend, label modes), readable colours."""

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


def test_svg_has_a_viewbox_and_scales_inside_a_scrolling_box(tree):
    html = tree.to_svg()
    width, height = map(int, re.search(r'viewBox="0 0 (\d+) (\d+)"', html).groups())
    assert f'width="{width}" height="{height}"' in html
    assert html.startswith('<div class="wb-drawing" style="overflow-x:auto;max-width:100%">')
    assert "max-width:100%" in html and "height:auto" in html


def test_legend_names_every_colour_and_the_number_shown(tree):
    legend = re.search(r'<g class="wb-legend">(.*?)</g>', tree.to_svg()).group(1)
    for name in ("kept", "pruned", "completed (EOS)", "returned path",
                 "numbers: cumulative logprob"):
        assert f">{name}<" in legend
    assert ">numbers: score (length-penalised)<" in tree.to_svg(label="score")


def test_edges_join_the_end_of_the_parents_label(tree):
    html = tree.to_svg(label="logprob")
    texts = {m.group(2): float(m.group(1))
             for m in re.finditer(r'<text x="([\d.]+)" y="[\d.]+" font-size="11" '
                                  r'font-weight="\w+" fill="#\w+">([^<]*)</text>', html)}
    a_start = texts["a -0.10"]
    a_end = a_start + beam_svg.CHAR_W * len("a -0.10") + 3
    lines = re.findall(r'<line x1="([\d.]+)" y1="[\d.]+" x2="([\d.]+)"', html)
    children_of_a = [(float(x1), float(x2)) for x1, x2 in lines if abs(float(x1) - a_end) < 0.06]
    assert len(children_of_a) == 2  # c and d start where a's label ends
    assert all(x2 + 3 == pytest.approx(texts["c -0.20"], abs=0.06) for _, x2 in children_of_a)


def test_long_tokens_are_ellipsised_with_the_full_text_on_hover(tree):
    html = tree.to_svg()
    assert "> internatio… -2.00<" in html
    assert "<title>&#x27; internationalisation&#x27;: step 1, rank 2, kept" in html


def test_selected_node_is_marked_and_returned_paths_drawn(tree):
    html = tree.to_svg(selected=3)
    assert re.search(r'<g><rect class="wb-selected"[^>]*/><title>&#x27;d&#x27;', html)
    assert html.count(f'stroke="{beam_svg.COLOURS["returned"]}" stroke-width="2.5"') == 1 + 2
    assert tree.to_svg(highlight=[]).count('stroke-width="2.5"') == 1  # the legend's only


def test_every_colour_reads_on_the_drawings_background():
    for colour in (*beam_svg.COLOURS.values(), "#222222"):
        assert contrast(colour, beam_svg.BACKGROUND) >= 4.5, colour
    assert contrast("#222222", beam_svg.SELECTED) >= 4.5


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
