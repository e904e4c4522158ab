"""Tidies notebooks after `jupyter nbconvert --execute`: what JupyterLab would rewrite on opening.

`python scripts/tidy_notebooks.py notebooks/13_tools.ipynb ...` (no argument: every notebook):
the kernelspec named as ipykernel names it, saved progress bars (a widget view whose text is
`NN%|`) removed, and the widget state that no saved view reaches (the loading bars' models,
which nbclient keeps after `notebook_setup` cleared their views) dropped.
`tests/test_notebooks.py` checks all three.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat
from ipykernel.kernelspec import get_kernel_dict

VIEW = "application/vnd.jupyter.widget-view+json"
STATE = "application/vnd.jupyter.widget-state+json"


def reachable(state: dict, roots: list[str]) -> set[str]:
    """The widget models of `state` that the views `roots` reach (the notebook test's check)."""
    seen, todo = set(), list(roots)
    while todo:
        model = todo.pop()
        if model in state and model not in seen:
            seen.add(model)
            todo += re.findall(r"IPY_MODEL_([0-9a-f]{32})", json.dumps(state[model]))
    return seen


def tidy(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.metadata.kernelspec.display_name = get_kernel_dict()["display_name"]
    roots = []
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        kept = []
        for out in cell.outputs:
            data = out.get("data", {})
            if VIEW in data and re.search(r"\d+%\|", "".join(data.get("text/plain", ""))):
                continue  # a progress bar
            if VIEW in data:
                roots.append(data[VIEW]["model_id"])
            kept.append(out)
        cell.outputs = kept
    widgets = nb.metadata.get("widgets", {}).get(STATE)
    if widgets is not None:
        live = reachable(widgets["state"], roots)
        widgets["state"] = {k: v for k, v in widgets["state"].items() if k in live}
        if not widgets["state"]:
            del nb.metadata["widgets"]
    nbformat.write(nb, path)


if __name__ == "__main__":
    for name in sys.argv[1:] or sorted(str(p) for p in Path("notebooks").glob("*.ipynb")):
        tidy(Path(name))
