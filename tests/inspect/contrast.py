"""WCAG 2 contrast of CSS colours (`#rgb`, `#rrggbb`, `hsl(h, s%, l%)`), for the theme tests."""

from __future__ import annotations

import colorsys
import re


def rgb(colour: str) -> tuple[float, float, float]:
    """A CSS colour as r, g, b in [0, 1]."""
    colour = colour.strip()
    if m := re.fullmatch(r"hsl\((\d+(?:\.\d+)?),\s*(\d+(?:\.\d+)?)%,\s*(\d+(?:\.\d+)?)%\)", colour):
        h, s, l = (float(v) for v in m.groups())
        return colorsys.hls_to_rgb(h / 360, l / 100, s / 100)
    hexes = colour.lstrip("#")
    if len(hexes) == 3:
        hexes = "".join(c * 2 for c in hexes)
    return tuple(int(hexes[i:i + 2], 16) / 255 for i in (0, 2, 4))


def luminance(colour: str) -> float:
    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb(colour))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: str, bg: str) -> float:
    """The WCAG contrast ratio, 1 to 21; AA asks 4.5 for normal text."""
    hi, lo = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)
