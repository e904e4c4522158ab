"""The manual's code samples run, and the README's links lead somewhere.

Every ```python block of README.md and docs/**/*.md runs, a page's blocks in order in one shared
namespace (as a reader runs them top to bottom), one test per page, from the repository root (the
samples name `data/loras/pirate`). A block that cannot run as it stands is marked in the page, on
the line before its fence, with `<!-- skip: why -->`: the reader still sees it, and
`test_skipped_samples_are_few_and_say_why` lists every such block with its reason, so a new skip
is a visible change. Pages whose samples load a real model (SmolLM2, MiniLM: `make install` puts
them in place) are marked slow; they still run in `make test`. (mkdocs build --strict checks
the links inside docs/.)
"""

from __future__ import annotations

import gc
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SKIP = re.compile(r"<!--\s*skip:\s*(?P<why>.*?)\s*-->")
NEEDS_MODEL = re.compile(r"\b(?:LLM|Workbench|notebook_setup|CaptureJob)\(")

# Every sample marked `<!-- skip: ... -->`, by page: keep this short and honest.
EXPECTED_SKIPS: dict[str, list[str]] = {}


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    code: str
    skip: str | None  # the reason, where the page marks the block


def blocks(path: Path) -> list[Block]:
    """The page's ```python blocks, in order, each with the skip reason its page gives it."""
    lines = path.read_text(encoding="utf-8").split("\n")
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() != "```python":
            i += 1
            continue
        before = next((line for line in reversed(lines[:i]) if line.strip()), "")
        mark = SKIP.fullmatch(before.strip())
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        found.append(Block(str(path.relative_to(ROOT)), i + 1, "\n".join(lines[i + 1:end]),
                           mark["why"] if mark else None))
        i = end + 1
    return found


def pages_with_samples():
    for path in PAGES:
        found = blocks(path)
        if not found:
            continue
        slow = any(NEEDS_MODEL.search(b.code) for b in found if b.skip is None)
        yield pytest.param(path, id=str(path.relative_to(ROOT)),
                           marks=[pytest.mark.slow] if slow else [])


def test_the_pages_have_samples():
    every = [b for path in PAGES for b in blocks(path)]
    assert len(every) >= 15
    assert blocks(ROOT / "README.md")


@pytest.mark.parametrize("block", [b for path in PAGES for b in blocks(path)],
                         ids=lambda b: f"{b.page}:{b.line}")
def test_every_sample_compiles(block: Block):
    """Fast, without a model: each block, skipped ones too, is valid Python."""
    compile(block.code, f"{block.page}:{block.line}", "exec")


@pytest.mark.parametrize("path", list(pages_with_samples()))
def test_the_samples_of_a_page_run_in_order(path: Path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")  # the samples' plot() calls draw off-screen
    import matplotlib.pyplot as plt

    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": "__docs__"}
    try:
        for block in blocks(path):
            if block.skip is not None:
                continue
            code = compile(block.code, f"{block.page}:{block.line}", "exec")
            try:
                exec(code, namespace)
            except Exception as exc:
                raise AssertionError(f"the sample at {block.page}:{block.line} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
    finally:
        for value in list(namespace.values()):  # a sample that failed midway leaves these open
            if type(value).__name__ == "KernelServer":
                value.stop()
            elif type(value).__name__ == "Workbench":
                value.close()
        namespace.clear()
        plt.close("all")
        gc.collect()


def test_skipped_samples_are_few_and_say_why():
    skipped: dict[str, list[str]] = {}
    for path in PAGES:
        for block in blocks(path):
            if block.skip is not None:
                assert block.skip, f"{block.page}:{block.line}: a skip says why"
                skipped.setdefault(block.page, []).append(block.skip)
    assert skipped == EXPECTED_SKIPS


LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def test_the_readme_links_point_at_files_in_the_repository():
    targets = [m["target"] for m in LINK.finditer((ROOT / "README.md").read_text())]
    relative = [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)
                and not t.startswith("#")]
    assert len(relative) >= 15
    outside = [t for t in relative if not (ROOT / t).resolve().is_relative_to(ROOT)]
    missing = [t for t in relative if not (ROOT / t.split("#")[0]).exists()]
    assert (outside, missing) == ([], [])
