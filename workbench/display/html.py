"""Small deterministic HTML helpers shared by the inspect objects' `_repr_html_`.

Everything here is a pure function of its arguments: no uuids, timestamps or memory
addresses, inline CSS only (no CDN), floats in a fixed format, element ids from a content
hash, so the same object renders to the same string (nbval compares notebook outputs).
Run-dependent values (durations) go through `duration`, which wraps them in a
`<span class="wb-time">` so a notebook sanitizer can mask them.
"""

from __future__ import annotations

import base64
import colorsys
import hashlib
import html as _html
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any


def escape(value: Any) -> str:
    """Text for HTML, quotes escaped too (safe inside attributes)."""
    return _html.escape(str(value), quote=True)


def token_text(token: str) -> str:
    """A token for display: newlines and tabs shown as escapes, the rest escaped."""
    return escape(token.replace("\n", "\\n").replace("\t", "\\t"))


# Characters a token can hold that would print as nothing (or as a line break): each drawn as a
# visible mark, so `' '` is not a blank cell and `'\n\n'` not an empty one (as inseq and
# circuitsvis do); the raw token stays in the hover and in every frame.
MARKS = {" ": "␣", "\n": "⏎", "\t": "⇥", "\r": "␍", "\xa0": "⍽", "\x7f": "␡"}
EMPTY_TOKEN = "∅"


def visible(token: str) -> str:
    """A token with whitespace and control characters as visible marks (not yet escaped):
    space `␣`, newline `⏎`, tab `⇥`, other C0 controls as their control pictures (U+2400),
    other invisible characters as `\\uXXXX`; the empty token as `∅`."""
    if not token:
        return EMPTY_TOKEN
    out = []
    for ch in token:
        if ch in MARKS:
            out.append(MARKS[ch])
        elif ord(ch) < 0x20:
            out.append(chr(0x2400 + ord(ch)))
        elif ch.isspace() or unicodedata.category(ch) in ("Cf", "Cc", "Zl", "Zp"):
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def token_html(token: str) -> str:
    """A token for a strip, a table cell or a heatmap: its visible marks (`visible`) escaped,
    inside a span whose hover shows the raw token (`repr`)."""
    return f'<span class="wb-token" title="{escape(repr(token))}">{escape(visible(token))}</span>'


def token_strip(tokens: Iterable[str]) -> str:
    """Tokens side by side as `token_html`, each boundary a thin line (and a place to wrap)."""
    return "<wbr>".join(f'<span style="border-right:1px solid var(--jp-border-color1,#999999);'
                        f'padding:0 1px">{token_html(t)}</span>' for t in tokens)


def fmt(value: float | None, digits: int = 4) -> str:
    """Fixed float format; None and NaN as an em dash, infinities spelled out."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if math.isinf(value):
        return "-inf" if value < 0 else "inf"
    return f"{value:.{digits}f}"


def _coarse(value: Any) -> Any:
    """Floats to 4 decimals (recursively), so last-bit differences between CPUs or kernels
    don't change an id when nothing visible changed."""
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, dict):
        return {k: _coarse(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_coarse(v) for v in value]
    return value


def content_id(prefix: str, *parts: Any) -> str:
    """An element id from a hash of the content (stable across runs and machines)."""
    digest = hashlib.sha1(repr(_coarse(parts)).encode("utf-8")).hexdigest()[:10]
    return f"{prefix}-{digest}"


def prob_color(p: float | None) -> str:
    """Background colour for a probability: pastel red (0) through yellow to green (1), as hex
    (JupyterLab keeps hex colours in an untrusted notebook, not `hsl()`)."""
    if p is None or math.isnan(p):
        return "#dddddd"
    p = min(max(p, 0.0), 1.0)
    r, g, b = colorsys.hls_to_rgb(round(120 * p) / 360, 0.8, 0.75)
    return "#" + "".join(f"{round(255 * c):02x}" for c in (r, g, b))


def static_fallback(live: str, svg: str, width: int, height: int, key: str) -> str:
    """`live` HTML (inline SVG: hover tooltips) where the notebook is trusted, else `svg` as a
    picture: an untrusted notebook (a fresh clone) strips `<svg>` and `<style>` but keeps an
    `<img>` with a data URI and inline `display`. The `<style>` swaps them when it runs."""
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return (f'<div class="{key}"><div class="wb-static" style="display:block">'
            f'<img alt="drawing (static copy)" width="{width}" height="{height}" '
            f'style="max-width:100%;height:auto" src="data:image/svg+xml;base64,{data}"/></div>'
            f'<div class="wb-live" style="display:none">{live}</div>'
            f"<style>.{key} .wb-static{{display:none !important}}"
            f".{key} .wb-live{{display:block !important}}</style></div>")


def duration(seconds: float | None) -> str:
    """A run-dependent duration, always `12.3 ms`, inside a maskable `wb-time` span."""
    text = "—" if seconds is None else f"{seconds * 1000:.1f} ms"
    return f'<span class="wb-time">{text}</span>'


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *,
          escape_cells: bool = True) -> str:
    """A plain `<table>`; cells are escaped unless they are already HTML."""
    cell = escape if escape_cells else str
    head = "".join(f'<th style="text-align:left;padding:2px 6px">{escape(h)}</th>'
                   for h in headers)
    body = "".join("<tr>" + "".join(f'<td style="padding:2px 6px">{cell(c)}</td>' for c in row)
                   + "</tr>" for row in rows)
    return (f'<table style="border-collapse:collapse;font-size:12px"><thead><tr>{head}</tr>'
            f"</thead><tbody>{body}</tbody></table>")


# -- colours that read in JupyterLab's light and dark themes ----------------------------------
# Text drawn on one of our own backgrounds sets its colour (INK, >= 4.5:1 on every background
# below, tested); text on the page's background takes JupyterLab's theme variables, with a
# fallback for other front-ends.
INK = "#1a1a1a"
MUTED = "var(--jp-content-font-color2, #5c5c5c)"
ERROR = "var(--jp-error-color1, #b00020)"


def on(background: str) -> str:
    """CSS for text on a coloured background: the background and dark ink."""
    return f"background:{background};color:{INK}"


# The dark theme: each light background we paint (`background:#rrggbb`, inline) has a dark
# counterpart of the same hue, for light ink; `themed` adds the rules where JupyterLab says its
# theme is dark, so a view keeps its inline light colours (what an untrusted notebook, which
# drops `<style>`, and other front-ends show) and its markup.
DARK_INK = "#e8e8e8"


def dark(background: str) -> str:
    """The dark theme's counterpart of a light `#rrggbb` background: same hue, dark enough
    for `DARK_INK` (>= 4.5:1, tested)."""
    r, g, b = (int(background[i:i + 2], 16) / 255 for i in (1, 3, 5))
    hue, _, sat = colorsys.rgb_to_hls(r, g, b)
    rgb = colorsys.hls_to_rgb(hue, 0.24, min(sat, 0.45))
    return "#" + "".join(f"{round(255 * c):02x}" for c in rgb)


def themed(html: str) -> str:
    """`html` followed by the dark theme's rules for the backgrounds it paints (sorted, so the
    same view gives the same string)."""
    colours = sorted(set(re.findall(r"background:(#[0-9a-f]{6})\b", html)))
    if not colours:
        return html
    rules = "".join(f"body[data-jp-theme-light='false'] [style*='background:{c}']"
                    f"{{background:{dark(c)} !important;color:{DARK_INK} !important}}"
                    for c in colours)
    return f'{html}<style class="wb-theme">{rules}</style>'


def error_box(text: str) -> str:
    """An error message (already escaped) in JupyterLab's error colours, a light fallback."""
    return (f'<div class="wb-error" style="color:var(--jp-content-font-color1,{INK});'
            f"background:var(--jp-rendermime-error-background,#fff0f0);padding:4px 8px;"
            f'border-left:3px solid {ERROR};white-space:pre-wrap">{text}</div>')


def caption(text: str) -> str:
    """A small line of secondary text (already escaped or built from escaped parts)."""
    return f'<div class="wb-caption" style="font-size:11px;color:{MUTED}">{text}</div>'


def swatches(items: Iterable[tuple[str, str]], title: str = "") -> str:
    """A colour legend: each (label, background) as a small chip with its label."""
    chips = "".join(f'<span style="{on(bg)};padding:0 4px;margin-right:4px;'
                    f'border:1px solid #999">{escape(label)}</span>' for label, bg in items)
    head = f"{escape(title)} " if title else ""
    return f'<div class="wb-legend" style="font-size:11px;color:{MUTED}">{head}{chips}</div>'


def prob_legend(extra: Iterable[tuple[str, str]] = ()) -> str:
    """The legend of `prob_color`: chips at probabilities 0, 0.25, 0.5, 0.75 and 1, then any
    `extra` (label, CSS for a sample chip) pairs."""
    chips = [(f"p={p:g}", prob_color(p)) for p in (0.0, 0.25, 0.5, 0.75, 1.0)]
    more = "".join(f'<span style="color:{INK};background:#f5f5f5;{css};padding:0 4px;'
                   f'margin-right:4px">{escape(label)}</span>' for label, css in extra)
    return swatches(chips, "token probability:")[:-len("</div>")] + more + "</div>"


def clip_words(text: str, limit: int = 60) -> str:
    """Escaped text up to `limit` characters, cut at a word boundary with an ellipsis (a word
    longer than `limit` is cut inside); the full text on hover."""
    if len(text) <= limit:
        return escape(text)
    cut = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit - 1]
    return f'<span title="{escape(text)}">{escape(cut.rstrip())}…</span>'


def ellipsis(text: str, limit: int = 24) -> str:
    """Escaped text cut to `limit` characters with an ellipsis; the full text on hover."""
    if len(text) <= limit:
        return escape(text)
    return f'<span title="{escape(text)}">{escape(text[:limit - 1])}…</span>'
