"""BeamExplorer headless: widget state and the HTML it shows, on a hand-made BeamTree."""

from __future__ import annotations

import re

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
    assert ex.step in ex.children and ex.node in ex.children[6].children
    assert (ex.prompt.value, ex.beam_width.value, ex.length_penalty.value) == ("Hi", 2, 1.0)


def test_starts_at_the_last_step_with_the_best_node_selected(tree):
    ex = BeamExplorer(tree=tree)
    assert (ex.step.min, ex.step.max, ex.step.value) == (1, 2, 2)
    assert [value for _, value in ex.node.options] == [2, 3]  # kept and returned: not 'e'
    assert ex.node.value == 2
    ex.listed.value = "all"
    assert [value for _, value in ex.node.options] == [2, 3, 4] and ex.node.value == 2
    assert "step 2 of 2: 3 candidates (1 kept, 1 completed, 1 pruned)" in ex.view.value


def test_moving_the_step_slider_changes_the_tree_and_the_node_list(tree):
    ex = BeamExplorer(tree=tree)
    ex.step.value = 1
    assert "step 1 of 2: 2 candidates (2 kept, 0 completed, 0 pruned)" in ex.view.value
    assert [value for _, value in ex.node.options] == [0, 1]
    assert ex.node.value == 0  # on the best path
    svg = re.search(r"<svg.*</svg>", ex.view.value).group()
    assert ">a -0.10<" in svg and ">b -2.00<" in svg and ">d " not in svg


def test_selecting_a_node_shows_its_path_and_alternatives(tree):
    ex = BeamExplorer(tree=tree)
    ex.step.value = 1
    ex.node.value = 1
    html = ex.view.value
    assert re.search(r"node #1: Hi<b>(<span[^>]*>)+b</span>", html)
    assert "alternatives at step 1 (same parent)" in html
    assert "expanded from it at step 2" in html and ">e<" in html


def test_the_first_step_shows_candidates(tree):
    ex = BeamExplorer(tree=tree)
    ex.step.value = 0  # clamped: step 0 would be the prompt alone
    assert ex.step.value == 1 and [value for _, value in ex.node.options] == [0, 1]
    assert "step 1 of 2: 2 candidates" in ex.view.value and "<svg" in ex.view.value


def test_controls_are_initialised_from_the_tree_shown(tree):
    ex = BeamExplorer(tree=tree, max_tokens=16)
    assert (ex.prompt.value, ex.beam_width.value, ex.max_tokens.value) == ("Hi", 2, 2)


def test_returned_paths_and_the_selected_node_are_marked_at_every_step(tree):
    ex = BeamExplorer(tree=tree)
    ex.step.value = 1  # node 0 ('a') leads to both returned sequences, node 1 ('b') to none
    svg = ex.view.value
    assert svg.count('stroke:var(--wb-returned,#c62828)" stroke-width="2.5"') == 1 + 1  # + a's
    assert re.search(r'class="wb-selected"[^>]*/><title>&#x27;a&#x27;', svg)
    ex.node.value = 1
    assert re.search(r'class="wb-selected"[^>]*/><title>&#x27;b&#x27;', ex.view.value)


def test_label_toggle_changes_the_numbers_drawn(tree):
    ex = BeamExplorer(tree=tree)
    assert ">d -0.60<" in ex.view.value and "numbers: cumulative logprob" in ex.view.value
    ex.label.value = "logprob"
    assert ">d -0.50<" in ex.view.value and "numbers: token logprob" in ex.view.value
    ex.label.value = "score"
    assert ">d -0.20<" in ex.view.value


def test_tree_until_renumbers_and_keeps_returned_nodes_of_those_steps(tree):
    part = tree_until(tree, 1)
    assert [n.id for n in part] == [0, 1] and part.returned == []
    assert tree_until(tree, 2).to_dict() == tree.to_dict()


def test_html_fallback_is_deterministic_and_matches_the_view(tree):
    ex = BeamExplorer(tree=tree)
    assert ex.to_html() == ex._repr_html_() == render_step(tree, 2, 2, static=True, zoom=1.0)
    live = render_step(tree, 2, 2, zoom=1.0, interactive=True)  # no picture copy, clickable
    assert ex.view.value == live
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
    assert calls[-1] == ("Hi", 2, 2.0, 2)  # the tree it showed set width and tokens to its own
    assert ex.step.value == 2


def test_a_search_shows_its_busy_state_then_the_new_tree(tree):
    seen = []

    def search(prompt, width, length_penalty, max_tokens):
        seen.append((ex.button.disabled, ex.button.description, ex.status.value,
                     ex.view.value))
        return tree

    ex = BeamExplorer(tree=tree, search=search)
    ex.button.click()
    disabled, label, status, view = seen[0]
    assert disabled and label == "Searching…"
    assert view.startswith('<div class="wb-dimmed" style="opacity:0.45">')  # the old tree, dimmed
    assert "searching: beam width 2, up to 2 tokens" in status
    assert not ex.button.disabled and ex.status.value == ""
    assert ex.view.value == render_step(tree, 2, 2, zoom=1.0, interactive=True)


def test_the_busy_line_counts_the_seconds_of_a_long_search(tree):
    import time

    seen = []

    def search(prompt, width, length_penalty, max_tokens):
        time.sleep(2.5)
        seen.append(ex.status.value)
        return tree

    ex = BeamExplorer(tree=tree, search=search)
    ex.button.click()
    assert re.search(r"[12] s elapsed", seen[0]), seen[0]
    assert ex.status.value == ""


def test_an_error_is_shown_inside_the_widget_and_the_old_tree_stays(tree):
    from workbench.errors import ValidationError

    def search(prompt, width, length_penalty, max_tokens):
        raise ValidationError("The prompt cannot be empty.", parameter="prompt", value="")

    ex = BeamExplorer(tree=tree, search=search)
    before = ex.view.value
    ex.button.click()  # no exception escapes the button
    assert "400 BadRequestError" in ex.status.value and "prompt" in ex.status.value
    assert ex.view.value == before and not ex.button.disabled
    with pytest.raises(ValidationError):
        ex.run()


def test_a_click_on_a_node_in_the_drawing_selects_it(tree):
    ex = BeamExplorer(tree=tree)
    assert 'data-pick="4"' not in ex.view.value  # 'e' is pruned: folded under 'b'
    ex.pick.value = "+1"  # the click on b's "+1 pruned" row
    assert 'data-pick="4"' in ex.view.value and "▾ 1 pruned" in ex.view.value
    ex.pick.value = "4"  # then on 'e' itself
    assert ex.node.value == 4 and 4 in [v for _, v in ex.node.options]
    assert "node #4:" in ex.view.value and ex.pick.value == ""  # ready for the next click
    ex.pick.value = "1"  # a node of an earlier step: the drawing stays, the list adds it
    assert (ex.step.value, ex.node.value) == (2, 1) and ex.node.options[-1][1] == 1
    assert "step 2 of 2" in ex.view.value and "node #1:" in ex.view.value
    ex.pick.value = "+1"  # folds again
    ex.step.value = 2
    assert 'data-pick="4"' not in ex.view.value


def test_pruned_candidates_can_all_be_shown(tree):
    ex = BeamExplorer(tree=tree)
    assert "▸ +1 pruned" in ex.view.value
    ex.pruned.value = "all"
    assert "+1 pruned" not in ex.view.value and 'data-pick="4"' in ex.view.value


def test_zoom_scales_the_drawing(tree):
    ex = BeamExplorer(tree=tree)
    width = int(re.search(r'viewBox="0 0 (\d+) ', ex.view.value).group(1))
    assert f'width="{width}"' in ex.view.value  # 100%: its own size, scrolling if wider
    ex.zoom.value = 0.5
    assert f'width="{round(width / 2)}"' in ex.view.value
    ex.zoom.value = 0.0  # fit width
    assert "max-width:100%" in ex.view.value


def test_enter_in_the_prompt_searches(tree):
    calls = []
    ex = BeamExplorer(tree=tree, search=lambda *args: calls.append(args) or tree)
    ex.prompt.value = "Hello"
    ex.prompt._handle_custom_msg({"event": "submit"}, [])  # what the text box sends on Enter
    assert calls == [("Hello", 2, 1.0, 2)]


def test_a_beam_width_above_the_limit_is_refused_in_words(tree):
    from workbench.widgets.beam_explorer import MAX_BEAM_WIDTH

    calls = []
    ex = BeamExplorer(tree=tree, search=lambda *args: calls.append(args) or tree)
    ex.beam_width.value = 40
    assert ex.beam_width.value == 40  # not clamped silently
    assert f"beam width must be between 1 and {MAX_BEAM_WIDTH} in the explorer, got 40" \
        in ex.status.value
    ex.button.click()
    assert calls == [] and "parameter=beam_width" in ex.status.value
    ex.beam_width.value = 16
    assert ex.status.value == ""


def test_an_error_names_its_parameter_once():
    from workbench.errors import ValidationError
    from workbench.widgets.beam_explorer import error_html

    html = error_html(ValidationError("The prompt cannot be empty.", parameter="prompt",
                                      value=[]))
    assert html.count("parameter") == 1 and "(parameter=prompt, value=[])" in html


def test_the_view_spans_the_widget_and_the_drawing_takes_clicks(tree):
    ex = BeamExplorer(tree=tree)
    assert "wb-explorer" in ex._dom_classes
    assert "wb-pick" in ex.pick._dom_classes and ex.pick.layout.display == "none"
    assert "onclick" in ex.view.value and "onclick" not in ex.to_html()


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


def test_a_search_fills_the_widgets_own_progress_bar(tiny_llm):
    """The search's engine steps move the explorer's bar (LLM.beam_search's use_tqdm takes a
    callable, as vLLM's); hidden when idle."""
    ex = BeamExplorer(tiny_llm, "Once upon a time", beam_width=2, max_tokens=4)
    assert ex.progress in ex.children and ex.progress.layout.display == "none"
    seen = []
    ex.progress.observe(lambda change: seen.append(change["new"]), names="value")
    ex.button.click()
    assert ex.progress.max == 4 and seen[-1] == 4 and sorted(seen) == seen and len(seen) >= 3
    assert ex.progress.layout.display == "none"
