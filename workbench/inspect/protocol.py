"""`Inspectable`: what every inspect object offers, whatever it shows.

Four methods: `to_dict()` (plain JSON-able data), `to_frame()` (a pandas DataFrame),
`plot(..., ax=None)` (a matplotlib drawing on `ax`, or on a new figure; returns the Axes) and
`_repr_html_()` (deterministic HTML for the notebook). pandas and matplotlib load only when
`to_frame` or `plot` runs. `isinstance(obj, Inspectable)` checks that the four are there.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Inspectable(Protocol):
    """An inspect object: data, a frame, a plot and notebook HTML (see the module docstring)."""

    def to_dict(self) -> dict[str, Any]:
        """The object as plain, JSON-able data."""
        ...

    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per item (token, node, check, span, ...)."""
        ...

    def plot(self, *args: Any, ax: Any = None, **kwargs: Any) -> Any:
        """A matplotlib drawing on `ax` (None: a new figure); returns the Axes."""
        ...

    def _repr_html_(self) -> str:
        """Deterministic HTML for a notebook output."""
        ...
