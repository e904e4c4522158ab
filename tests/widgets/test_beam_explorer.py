"""BeamExplorer headless: widget state and the HTML it shows, on a hand-made BeamTree."""

from __future__ import annotations

import pytest

from workbench.inspect.beam_tree import BeamNode, BeamTree
from workbench.widgets import BeamExplorer, tree_until
from workbench.widgets.beam_explorer import render_step


@pytest.fixture
def tree() -> BeamTree:
    """Width 2, two steps: 'a' and 'b' kept at step 1; 'c' completes, 'd' goes on, 'e' pruned."""
    return BeamTree([1, 2], beam_width=2, length_penalty=1.0, prompt_text="Hi", nodes=[
        BeamNode(0, 1, 5, "a", -0.1, -0.1, None, 1, "kept", -0.05),
        BeamNode(1, 1, 6, "b", -2.0, -2.0, None, 2, "kept", -1.0),
        BeamNode(2, 2, 7, " c", -0.2, -0.3, 0, 1, "completed", -0.1),
        BeamNode(3, 2, 8, "d", -0.5, -0.6, 0, 2, "kept", -0.2),
        BeamNode(4, 2, 9, "e", -0.1, -2.1, 1, 1, "pruned", -0.7)], returned=[2, 3])


def test_children_are_the_controls_then_the_view(tree):
    ex = BeamExplorer(tree=tree)
    assert ex.children[0] is ex.prompt and ex.children[-1] is ex.view
    assert ex.step in ex.children and ex.node in ex.children
    assert (ex.prompt.value, ex.beam_width.value, ex.length_penalty.value) == ("Hi", 2, 1.0)


def test_starts_at_the_last_step_with_the_best_node_selected(tree):
    ex = BeamExplorer(tree=tree)
    assert (ex.step.min, ex.step.max, ex.step.value) == (0, 2, 2)
    assert [value for _, value in ex.node.options] == [2, 3, 4]
    assert ex.node.value == 2
    assert "step 2 of 2: 3 candidates (1 kept, 1 completed, 1 pruned)" in ex.view.value


def test_moving_the_step_slider_changes_the_tree_and_the_node_list(tree):
    ex = BeamExplorer(tree=tree)
    ex.step.value = 1
    assert "step 1 of 2: 2 candidates (2 kept, 0 completed, 0 pruned)" in ex.view.value
    assert [value for _, value in ex.node.options] == [0, 1]
    assert ex.node.value == 0  # on the best path
    assert tree_until(tree, 1).to_svg() in ex.view.value
    assert tree.to_svg() not in ex.view.value


def test_selecting_a_node_shows_its_path_and_alternatives(tree):
    ex = BeamExplorer(tree=tree)
    ex.step.value = 1
    ex.node.value = 1
    html = ex.view.value
    assert "node #1: Hi<b>b</b>" in html
    assert "alternatives at step 1 (same parent)" in html
    assert "expanded from it at step 2" in html and ">e<" in html


def test_step_zero_shows_only_the_prompt(tree):
    ex = BeamExplorer(tree=tree)
    ex.step.value = 0
    assert ex.node.options == () and ex.node.value is None
    assert "step 0 of 2: 0 candidates" in ex.view.value


def test_tree_until_renumbers_and_keeps_returned_nodes_of_those_steps(tree):
    part = tree_until(tree, 1)
    assert [n.id for n in part] == [0, 1] and part.returned == []
    assert tree_until(tree, 2).to_dict() == tree.to_dict()


def test_html_fallback_is_deterministic_and_matches_the_view(tree):
    ex = BeamExplorer(tree=tree)
    assert ex.to_html() == ex._repr_html_() == ex.view.value == render_step(tree, 2, 2)
    assert BeamExplorer(tree=tree).to_html() == ex.to_html()


def test_search_button_runs_the_search_with_the_controls(tree):
    calls = []

    def search(prompt, width, length_penalty, max_tokens):
        calls.append((prompt, width, length_penalty, max_tokens))
        return tree

    ex = BeamExplorer(prompt="Hi", search=search, beam_width=3, length_penalty=0.5, max_tokens=5)
    assert calls == [("Hi", 3, 0.5, 5)]
    ex.step.value = 1
    ex.length_penalty.value = 2.0
    ex.button.click()
    assert calls[-1] == ("Hi", 2, 2.0, 5)  # the tree it showed set the width back to 2
    assert ex.step.value == 2


def test_without_a_tree_or_a_search_it_waits():
    ex = BeamExplorer(prompt="Hi")
    assert ex.tree is None and "no search yet" in ex.to_html()


@pytest.fixture(scope="module")
def tiny_llm():
    from workbench import LLM
    from workbench.models import tiny_model

    return LLM(tiny_model("llama", seed=0, dtype="float32"))


def test_default_search_is_the_llms_beam_search(tiny_llm):
    from workbench import BeamSearchParams

    ex = BeamExplorer(tiny_llm, "Once upon a time", beam_width=2, max_tokens=3)
    expected = tiny_llm.beam_search(["Once upon a time"],
                                    BeamSearchParams(beam_width=2, max_tokens=3))[0].tree
    assert ex.tree.to_dict() == expected.to_dict()
    assert ex.step.max == expected.num_steps == 3
    ex.beam_width.value = 3
    ex.button.click()
    assert ex.tree.beam_width == 3 and len(ex.tree.step(1)) == 6  # 2 x width from the prompt
