"""Writes the API reference at build time (mkdocs-gen-files): one page per public module of
`workbench/`, found by walking the package tree, so a module that moves or appears is documented
where it now is without editing a list.

A page holds `::: workbench.x.y` (mkdocstrings reads the source statically with griffe; nothing
is imported). Left out: private modules (a part of the path starts with `_`, `__init__` aside:
it is its package's page), `__main__`, and what griffe cannot load statically (reported on the
build's log). `reference/SUMMARY.md` is the section's navigation (mkdocs-literate-nav), after the
hand-written `reference/public-api.md`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import griffe
import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "workbench"
log = logging.getLogger("mkdocs.plugins.gen_ref_pages")


def public_modules(root: Path = ROOT) -> list[tuple[str, ...]]:
    """The dotted parts of every public module and package under `root/workbench`, sorted."""
    found = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts[-1] == "__main__" or any(part.startswith("_") for part in parts):
            continue
        found.append(parts)
    return found


def documentable(parts: tuple[str, ...], package: griffe.Module) -> bool:
    """Whether griffe's static load of the package has this module."""
    try:
        obj = package["/".join(parts[1:]).replace("/", ".")] if len(parts) > 1 else package
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False
    return isinstance(obj, griffe.Module)


def main() -> None:
    package = griffe.load(PACKAGE, search_paths=[str(ROOT)], allow_inspection=False)
    nav = mkdocs_gen_files.Nav()
    for parts in public_modules():
        if not documentable(parts, package):
            log.info("gen_ref_pages: %s cannot be documented statically; left out", ".".join(parts))
            continue
        is_package = (ROOT.joinpath(*parts) / "__init__.py").exists()
        page = Path("reference", *parts, "index.md") if is_package else Path(
            "reference", *parts[:-1], f"{parts[-1]}.md")
        nav[parts] = page.relative_to("reference").as_posix()
        with mkdocs_gen_files.open(page, "w") as out:
            # the module's own heading is the page's title
            out.write(f"::: {'.'.join(parts)}\n    options:\n      heading_level: 1\n")
            if parts == (PACKAGE,):  # its names are the Public API page's; here the docstring
                out.write("      members: false\n")
        source = ROOT.joinpath(*parts, "__init__.py") if is_package else ROOT.joinpath(
            *parts[:-1], f"{parts[-1]}.py")
        mkdocs_gen_files.set_edit_path(page, source.relative_to(ROOT))
    with mkdocs_gen_files.open("reference/SUMMARY.md", "w") as summary:
        summary.write("* [Public API](public-api.md)\n")
        summary.writelines(nav.build_literate_nav())


main()
