"""Both JupyterLab themes: text on a background we colour sets its own colour (AA contrast);
text on the page takes the theme's colour (inherited or a `--jp-` variable), never a fixed grey
that disappears on a dark page."""

from __future__ import annotations

import math
import re

import pytest

from tests.inspect.contrast import contrast
from tests.inspect.test_protocol import INSTANCES
from workbench.display import html as h
from workbench.inspect import ParsedOutput
from workbench.inspect.beam_tree import BeamNode, BeamTree
from workbench.inspect.logprob_table import Alternative, LogprobRow, LogprobTable
from workbench.inspect.similarity import SimilarityMatrix
from workbench.widgets.logprob_viewer import render_position

DARK_PAGE, LIGHT_PAGE = "#111111", "#ffffff"  # JupyterLab's --jp-layout-color0 in each theme


def _table() -> LogprobTable:
    rows = tuple(LogprobRow(i, t, math.log(p), 1, None, (Alternative(t, math.log(p), 1),))
                 for i, (t, p) in enumerate([("The", 0.9), (" sky", 0.3), (" is", 0.02)]))
    return LogprobTable(rows)


def _outputs() -> dict[str, str]:
    tree = BeamTree([1], 1, 1.0, [BeamNode(0, 1, 5, "a", -0.1, -0.1, None, 1, "kept", -0.1)], [0])
    parsed = ParsedOutput.from_tokens(["<think>", "x", "</think>", "y"], reasoning_parser="qwen3")
    return {"LogprobTable": _table()._repr_html_(),
            "LogprobViewer": render_position(_table(), 1),
            "ParsedOutput": parsed._repr_html_(),
            "SimilarityMatrix": SimilarityMatrix(["q"], ["a", "b", "c"],
                                                 [[0.1, 0.5, 0.9]])._repr_html_(),
            "BeamTree": tree._repr_html_(),
            "BranchTree": INSTANCES["BranchTree"]._repr_html_(),
            "ModelComparison": INSTANCES["ModelComparison"]._repr_html_(),
            "DivergenceReport": INSTANCES["DivergenceReport"]._repr_html_(),
            "FeatureActivations": INSTANCES["FeatureActivations"]._repr_html_()}


def _styles(html: str) -> list[str]:
    return re.findall(r'style="([^"]*)"', html)


def _prop(style: str, name: str) -> str | None:
    """A property's value; a drawing's own variable (`var(--wb-x,#fallback)`) as its fallback,
    the light palette (the dark one is tested in test_beam_svg)."""
    m = re.search(rf"(?:^|;)\s*{name}\s*:\s*([^;]+)", style)
    if not m:
        return None
    value = m.group(1).strip()
    own = re.fullmatch(r"var\(--wb-[a-z]+,(#\w+)\)", value)
    return own.group(1) if own else value


@pytest.mark.parametrize("name", list(_outputs()))
def test_coloured_backgrounds_set_a_readable_text_colour(name):
    html = _outputs()[name]
    coloured = [s for s in _styles(html) if (_prop(s, "background") or "").startswith(("#", "hsl"))
                and "height:8px" not in s]  # the viewer's probability bars hold no text
    assert coloured, "the output colours something"
    for style in coloured:
        fg, bg = _prop(style, "color"), _prop(style, "background")
        assert fg is not None, f"{name}: {style!r} sets a background but no text colour"
        assert contrast(fg, bg) >= 4.5, (name, fg, bg)


@pytest.mark.parametrize("name", list(_outputs()))
def test_text_on_the_page_follows_the_theme(name):
    for style in _styles(_outputs()[name]):
        fg, bg = _prop(style, "color"), _prop(style, "background")
        if fg is not None and bg is None and not fg.startswith(("var(--jp-", "inherit")):
            # a fixed colour on the page's background must read on both themes' pages
            assert min(contrast(fg, DARK_PAGE), contrast(fg, LIGHT_PAGE)) >= 4.5, (name, fg)


def test_every_probability_colour_reads_with_ink():
    for i in range(101):
        assert contrast(h.INK, h.prob_color(i / 100)) >= 4.5
    assert contrast(h.INK, h.prob_color(None)) >= 4.5


def test_fallback_colours_of_theme_variables_read_on_a_light_page():
    for var in (h.MUTED, h.ERROR):
        fallback = re.search(r", (#\w+)\)$", var).group(1)
        assert contrast(fallback, LIGHT_PAGE) >= 4.5, var


def test_token_strips_carry_a_colour_legend():
    for name in ("LogprobTable", "LogprobViewer", "ParsedOutput", "SimilarityMatrix",
                 "BranchTree"):
        assert 'class="wb-legend"' in _outputs()[name], name


def _with_an_error() -> str:
    from workbench.inspect import ValidationReport
    from workbench.serving.recorder import Check

    error = {"error": {"message": "bad n", "type": "BadRequestError", "param": "n", "code": 400}}
    return ValidationReport("completions", (Check("n", "validate", "failed", "n"),),
                            error)._repr_html_()


def test_the_error_box_takes_the_themes_error_colours():
    html = _with_an_error()
    assert 'class="wb-error"' in html and "var(--jp-rendermime-error-background," in html
    for style in _styles(html):  # the status badge: its own ink on its own background
        if (_prop(style, "background") or "").startswith("#"):
            assert contrast(_prop(style, "color"), _prop(style, "background")) >= 4.5


@pytest.mark.parametrize("name", [n for n in _outputs() if n != "BeamTree"] + ["error"])
def test_every_painted_background_has_a_dark_counterpart(name):
    html = _with_an_error() if name == "error" else _outputs()[name]
    painted = set(re.findall(r"background:(#[0-9a-f]{6})", html.split('<style class="wb-theme">')[0]))
    rules = dict(re.findall(r"\[style\*='background:(#[0-9a-f]{6})'\]\{background:(#[0-9a-f]{6})"
                            r" !important;color:" + h.DARK_INK, html))
    assert painted and painted == set(rules), name
    assert "body[data-jp-theme-light='false']" in html


def test_dark_counterparts_read_with_dark_ink_and_keep_the_hue_order():
    from workbench.inspect.parsed_output import PART_COLORS
    from workbench.inspect.validation_report import _COLORS

    lights = [h.prob_color(i / 100) for i in range(101)] + [h.prob_color(None)]
    for colour in lights + list(PART_COLORS.values()) + list(_COLORS.values()):
        assert contrast(h.DARK_INK, h.dark(colour)) >= 4.5, colour
        assert contrast(h.DARK_INK, h.dark(colour)) > contrast(h.INK, h.dark(colour))
    assert h.dark(h.prob_color(0.0)) != h.dark(h.prob_color(1.0))


def test_plots_are_transparent_with_grey_text_that_reads_on_both_pages():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex, to_rgba
    from matplotlib_inline.backend_inline import _fetch_figure_metadata

    from tests.inspect.test_protocol import INSTANCES
    from workbench.display.figure import GREY, GREY_Y

    for grey in (GREY, GREY_Y):
        assert min(contrast(grey, DARK_PAGE), contrast(grey, LIGHT_PAGE)) >= 4.0
    for name, obj in INSTANCES.items():
        ax = obj.plot()
        try:
            assert ax.figure.patch.get_alpha() == 0.0, name
            for axes in ax.figure.axes:
                assert to_rgba(axes.get_facecolor())[3] == 0.0, name
                assert all(to_hex(t.get_color()) == GREY for t in axes.get_xticklabels()), name
                assert all(to_hex(t.get_color()) == GREY_Y for t in axes.get_yticklabels()), name
                assert to_hex(axes.title.get_color()) == GREY, name
            # what JupyterLab reads to paint a white (or dark) block behind a figure: nothing
            ax.figure.canvas.draw()
            assert _fetch_figure_metadata(ax.figure) is None, name
        finally:
            plt.close(ax.figure)
