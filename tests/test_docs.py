"""docs/structure.md stays true: every path it names exists, and every module is listed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STRUCTURE = ROOT / "docs" / "structure.md"
PATH = re.compile(r"`((?:workbench|scripts|tests|data|notebooks|docs)/[^`\s]*)`")


def named_paths() -> list[str]:
    """Every `dir/...` path in backticks; in a module row, the names that follow the first
    (`gemv.py`, `kernels.py`) are in its directory."""
    paths = []
    for line in STRUCTURE.read_text().splitlines():
        found = PATH.findall(line)
        paths += found
        row = re.match(r"\| (`[^|]+)\|", line)
        if row and found:
            folder = found[0].rsplit("/", 1)[0]
            paths += [f"{folder}/{name}" for name in re.findall(r"`([\w.]+\.(?:py|c))`", row.group(1))
                      if "/" not in name]
    return paths


def test_every_path_the_structure_page_names_exists():
    paths = named_paths()
    assert len(paths) > 100
    missing = sorted({p for p in paths if not (ROOT / p.rstrip("/")).exists()})
    assert missing == []


def test_every_module_of_the_package_has_a_line():
    """Packages' `__init__.py` files may go unlisted."""
    listed = set(named_paths())
    folders = {p.rstrip("/") for p in listed if p.endswith("/")}
    unlisted = sorted(
        str(path.relative_to(ROOT)) for path in (ROOT / "workbench").rglob("*.py")
        if str(path.relative_to(ROOT)) not in listed
        and not any(str(path.relative_to(ROOT)).startswith(f + "/") for f in folders)
        and path.name not in ("__init__.py", "__main__.py"))
    assert unlisted == []
