"""The notebooks' nbval plumbing: what `notebooks/sanitize.cfg` hides from the comparison.

nbval compares every stored output with a fresh run after these substitutions, so a number the
CPU's kernels round differently must disappear whole while tokens, ranks and counts stay.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SANITIZE = Path(__file__).parents[1] / "notebooks" / "sanitize.cfg"


def _sanitize(text: str) -> str:
    from nbval.plugin import get_sanitize_patterns

    for regex, replace in get_sanitize_patterns(SANITIZE.read_text()):
        text = re.sub(regex, replace, text)
    return text


@pytest.mark.parametrize(("here", "there"), [
    ("cum  -8.7999", "cum  -8.8001"),                   # a rounding boundary (issue 14)
    ("score -9.9996", "score -10.0004"),                # one more digit before the point
    ("p=1e-05", "p=0.00001"),                           # pandas' scientific notation
    ("     -0.2581      -2.7407", "   -10.2581   -2.7407"),  # a frame's column padding
    ('<line x1="50.0" y2="19.5"/>', '<line x1="50.0" y2="19.25"/>'),
    ("style='background:#a8f0a3;color:#1a1a1a'", "style='background:#aef0a3;color:#1a1a1a'"),
    ('<img src="data:image/svg+xml;base64,PHN2Zz4="/>', '<img src="data:image/svg+xml;base64,PHN2Zy8+"/>'),
    ('<svg viewBox="0 0 1010 344" width="1010" height="344" style="min-width:606px">',
     '<svg viewBox="0 0 1017 344" width="1017" height="344" style="min-width:610px">'),
    ("height:8px;width:82px;background", "height:8px;width:83px;background"),
    ('<span style="background-color:#2563eb88"', '<span style="background-color:#2563eb99"'),
    ('<svg id="wb-beamtree-5d19ec7112">', '<svg id="wb-beamtree-0a1b2c3d4e">'),
    # the dark theme's rules (the package's palette), absent from outputs saved before them
    ("<div>x</div><style class=\"wb-theme\">body[data-jp-theme-light='false'] "
     "[style*='background:#a8f0a3']{background:#224a22 !important}</style>", "<div>x</div>"),
])
def test_kernel_dependent_numbers_compare_equal(here, there):
    assert _sanitize(here) == _sanitize(there)


@pytest.mark.parametrize(("here", "there"), [
    ("step 1: ' Paris' kept", "step 1: ' London' kept"),  # tokens
    ("rank 1 kept", "rank 2 kept"),                       # ranks
    ("rank 1 kept", "rank 1 pruned"),                     # statuses
    ("nodes=132, returned=3", "nodes=131, returned=3"),   # counts
    ("[7042, 30]", "[7042, 31]"),                         # token ids
])
def test_stable_values_still_compare(here, there):
    assert _sanitize(here) != _sanitize(there)


NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def _code_cells(path: Path) -> list[dict]:
    import json

    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_nbval_plumbing_stays_out_of_the_readers_way(path):
    for cell in _code_cells(path):
        source = "".join(cell["source"])
        assert "NBVAL" not in source, "use the cell tag nbval-ignore-output, not a comment"
        assert not re.search(r"^\s*assert\b", source, re.M), "a check belongs in tests/"
        printed_checks = [line for line in source.splitlines()
                          if "print(" in line and "==" in line and " if " not in line]
        assert not printed_checks, "a printed equality check belongs in tests/"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if not p.stem.startswith("09")],
                         ids=lambda p: p.stem)
def test_every_notebook_starts_with_notebook_setup(path):
    first = _code_cells(path)[0]
    assert "workbench.notebook_setup(" in "".join(first["source"])
    assert "nbval-ignore-output" in first["metadata"].get("tags", [])  # a progress bar


def test_the_quickstarts_next_list_names_every_other_notebook():
    import json

    cells = json.loads(NOTEBOOKS[0].read_text())["cells"]
    next_list = "".join(cells[-1]["source"])
    assert next_list.startswith("Next:")
    for path in NOTEBOOKS[1:]:
        assert f"`{path.stem}`" in next_list, path.stem


# JupyterLab rewrites what differs from its running kernel when it opens a notebook, and marks it
# modified at once (checked by opening each in JupyterLab: the kernel's display name was the one
# change); a re-executed notebook also stores the loading bars' widget state and views.
VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_is_not_modified_by_opening_it(path):
    import json

    from ipykernel.kernelspec import get_kernel_dict

    spec = json.loads(path.read_text())["metadata"]["kernelspec"]
    assert spec == {"display_name": get_kernel_dict()["display_name"], "language": "python",
                    "name": "python3"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_stale_progress_bar_or_widget_state_is_saved(path):
    import json

    nb = json.loads(path.read_text())
    views = []
    for cell in _code_cells(path):
        for out in cell["outputs"]:
            text = "".join(out.get("data", {}).get("text/plain", "")) + "".join(out.get("text", ""))
            assert not re.search(r"\d+%\|", text), f"a saved progress bar: {text[:60]!r}"
            if VIEW in out.get("data", {}):
                views.append(out["data"][VIEW]["model_id"])
    state = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json",
                                                  {}).get("state", {})
    assert set(state) == _tidy().reachable(state, views), \
        "widget state of no saved view: scripts/tidy_notebooks.py"


def _tidy():
    """scripts/tidy_notebooks.py as a module (its reachability is the one this test checks)."""
    import importlib.util

    path = Path(__file__).parents[1] / "scripts" / "tidy_notebooks.py"
    spec = importlib.util.spec_from_file_location("tidy_notebooks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
