"""Matplotlib figures that read in JupyterLab's light and dark themes.

The kernel cannot know the page's theme, so every `plot()` ends with `neutral(ax)`: the figure
and its axes (a colorbar's too) on a transparent background, and text, ticks, spines and
legends in one mid-grey that reads on a white and on a near-black page. Colours inside the
drawing (bars, lines, a heatmap's cells) stay the plot's own; a heatmap of weights takes
`fading(colour)`, one colour at the weight's opacity (as the HTML grids draw their cells), so
its empty and low cells show the page, not a white block on a dark one.

JupyterLab paints a white block behind a transparent figure on its dark page (or a dark one on
its light page) when the inline backend says the figure needs it: it does so when every tick
label has one lightness (ITU BT.601 luma above or below one half). So the y axes' tick labels
take `GREY_Y`, a grey just above that line where `GREY` is just below, both legible on either
page: the metadata stays unset and the page itself shows behind the figure. An axis without
tick labels gets one empty label (no mark), so each axes holds both greys.
"""

from __future__ import annotations

from typing import Any

GREY = "#7a7a7a"  # >= 4:1 on JupyterLab's light (#ffffff) and dark (#111111) pages, tested
GREY_Y = "#837d84"  # as legible (>= 4:1 on both), luma just above one half where GREY's is below


def fading(colour: str, steps: int = 256) -> Any:
    """A colormap from transparent (0) to `colour` (1) by opacity alone: a cell shows the page
    behind it as much as its weight is low; masked and NaN cells are transparent too."""
    from matplotlib.colors import ListedColormap, to_rgb  # optional: only plots need it

    r, g, b = to_rgb(colour)
    cmap = ListedColormap([(r, g, b, i / (steps - 1)) for i in range(steps)],
                          name=f"fading{colour}")
    cmap.set_bad((0.0, 0.0, 0.0, 0.0))
    return cmap


def neutral(ax: Any) -> Any:
    """Makes `ax`'s figure transparent with grey text (see the module docstring); returns `ax`."""
    figure = ax.figure
    figure.patch.set_alpha(0.0)
    for axes in figure.axes:  # the plot's axes and any colorbar's
        axes.set_facecolor("none")
        axes.tick_params(colors=GREY, which="both")
        axes.tick_params(axis="y", labelcolor=GREY_Y, which="both")
        _both_lightnesses(axes)
        for spine in axes.spines.values():
            spine.set_edgecolor(GREY)
        for text in (axes.title, axes.xaxis.label, axes.yaxis.label):
            text.set_color(GREY)
        legend = axes.get_legend()
        if legend is not None:
            legend.get_frame().set_facecolor("none")
            legend.get_frame().set_edgecolor(GREY)
            for text in legend.get_texts():
                text.set_color(GREY)
    return ax


def _both_lightnesses(axes: Any) -> None:
    """Gives an axis of `axes` that has no tick labels one empty label without a tick mark, so
    the axes' tick labels hold both greys (see the module docstring)."""
    if len(axes.get_xticks()) == 0:
        axes.set_xticks([axes.get_xlim()[0]], labels=[""])
        axes.tick_params(axis="x", length=0)
    if len(axes.get_yticks()) == 0:
        axes.set_yticks([axes.get_ylim()[0]], labels=[""])
        axes.tick_params(axis="y", length=0)
