"""A griffe extension for the API reference: a docstring's bare `>>>` examples (plain prose
docstrings, no sections) become fenced `pycon` blocks, so Markdown does not read their `>>>` as
nested quotes."""

from __future__ import annotations

from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    """Wraps each run of `>>>` / `...` lines and the output lines under it (up to a blank line)
    in a ```pycon fence, at the run's indentation.

    >>> print(fence_doctests("Adds.\\n\\n>>> 1 + 1\\n2"))
    Adds.
    <BLANKLINE>
    ```pycon
    >>> 1 + 1
    2
    ```
    """
    out: list[str] = []
    lines = text.split("\n")
    i, fence = 0, False
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith("```"):
            fence = not fence
        if fence or not stripped.startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(stripped)]
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip():
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fences the doctests of every object's docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)
