"""Small deterministic HTML helpers shared by the inspect objects' `_repr_html_`.

Everything here is a pure function of its arguments: no uuids, timestamps or memory
addresses, inline CSS only (no CDN), floats in a fixed format, element ids from a content
hash, so the same object renders to the same string (nbval compares notebook outputs).
Run-dependent values (durations) go through `duration`, which wraps them in a
`<span class="wb-time">` so a notebook sanitizer can mask them.
"""

from __future__ import annotations

import hashlib
import html as _html
import math
from collections.abc import Iterable, Sequence
from typing import Any


def escape(value: Any) -> str:
    """Text for HTML, quotes escaped too (safe inside attributes)."""
    return _html.escape(str(value), quote=True)


def token_text(token: str) -> str:
    """A token for display: newlines and tabs shown as escapes, the rest escaped."""
    return escape(token.replace("\n", "\\n").replace("\t", "\\t"))


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
    """Background colour for a probability: red (0) through yellow to green (1)."""
    if p is None or math.isnan(p):
        return "#dddddd"
    p = min(max(p, 0.0), 1.0)
    return f"hsl({round(120 * p)}, 75%, 80%)"


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
