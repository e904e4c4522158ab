"""Small security helpers shared by every endpoint: paths from requests, secrets in logs.

`safe_join(root, name)` resolves a client-supplied name (a model or adapter directory, a file)
inside a configured root and refuses anything that would leave it: absolute paths, `..`
components, symlinks pointing outside, NUL bytes. `redact(text, secrets)` masks secrets (API
keys) in a string before it is logged.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from workbench.errors import ValidationError


def safe_join(root: str | os.PathLike, name: str, *, parameter: str = "path") -> Path:
    """`root / name`, resolved, guaranteed to lie inside `root`; else a `ValidationError`.

    >>> safe_join("/srv/loras", "style/v1").as_posix()
    '/srv/loras/style/v1'
    >>> safe_join("/srv/loras", "../etc/passwd")
    Traceback (most recent call last):
    ...
    workbench.errors.ValidationError: ... is outside the allowed directory. (parameter=path, ...)
    """
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValidationError("The path must be a non-empty string without NUL characters.",
                              parameter=parameter, value=name if isinstance(name, str) else None)
    base = Path(root).resolve()
    candidate = Path(name)
    if candidate.is_absolute():
        # an absolute path is allowed only when it already points inside the root
        target = candidate.resolve()
    else:
        target = (base / candidate).resolve()
    if target != base and base not in target.parents:
        raise ValidationError(f"The path {name!r} is outside the allowed directory.",
                              parameter=parameter, value=name)
    return target


def is_within(roots: Iterable[str | os.PathLike], path: str | os.PathLike) -> bool:
    """Whether `path` (resolved, symlinks followed) lies inside one of `roots`."""
    target = Path(path).resolve()
    for root in roots:
        base = Path(root).resolve()
        if target == base or base in target.parents:
            return True
    return False


def redact(text: str, secrets: Iterable[str], mask: str = "***") -> str:
    """`text` with every non-empty secret replaced by `mask`."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, mask)
    return text
