"""The beam tree's layers: plain data in the engine (no torch), drawing in inspect; the
client-side search loads without torch; facades hand out the drawable tree."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workbench.engine.requests.beam_search import BeamSearchOutput
from workbench.engine.requests.beam_tree import BeamNode, BeamTreeData
from workbench.inspect.beam_tree import BeamTree, with_beam_tree


def _loads_without_torch(module: str) -> bool:
    code = f"import sys, {module}; sys.exit('torch' in sys.modules)"
    return subprocess.run([sys.executable, "-c", code], timeout=120, check=False).returncode == 0


@pytest.mark.parametrize("module", ["workbench.engine.requests.beam_tree", "workbench.inspect.remote_beam",
                                    "workbench.inspect.beam_tree"])
def test_beam_data_and_the_remote_search_load_without_torch(module):
    assert _loads_without_torch(module)


def _data() -> BeamTreeData:
    return BeamTreeData([1], 1, 1.0, [BeamNode(0, 1, 5, "a", -0.1, -0.1, None, 1, "kept", -0.1)],
                        [0], prompt_text="Hi")


def test_of_views_engine_data_as_a_drawable_tree_with_the_same_fields():
    data = _data()
    tree = BeamTree.of(data)
    assert isinstance(tree, BeamTree) and tree.to_dict() == data.to_dict()
    assert BeamTree.of(tree) is tree and tree.nodes is data.nodes
    assert repr(tree).startswith("BeamTree(width=1") and repr(data).startswith("BeamTreeData(")
    assert "<svg" in tree._repr_html_()


def test_with_beam_tree_swaps_only_the_tree():
    out = BeamSearchOutput([], _data(), "r1", "Hi", [1])
    drawn = with_beam_tree(out)
    assert isinstance(drawn.tree, BeamTree) and drawn.request_id == "r1"
    assert with_beam_tree(drawn) is drawn
    assert with_beam_tree(BeamSearchOutput([], None)).tree is None


@pytest.mark.parametrize("module", ["workbench.engine.requests.beam_tree", "workbench.inspect.beam_tree"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), verbose=False)
    assert result.failed == 0 and result.attempted > 0


def test_the_drawing_does_not_import_the_tree_it_draws():
    """beam_svg draws the engine's plain data; only beam_tree imports beam_svg, type-checking
    imports counted too (no circle for import-linter to miss)."""
    import grimp

    graph = grimp.build_graph("workbench", exclude_type_checking_imports=False, cache_dir=None)
    assert graph.direct_import_exists(importer="workbench.inspect.beam_tree",
                                      imported="workbench.inspect.beam_svg")
    assert not graph.chain_exists(importer="workbench.inspect.beam_svg",
                                  imported="workbench.inspect.beam_tree")
