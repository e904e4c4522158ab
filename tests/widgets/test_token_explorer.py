"""TokenExplorer headless: pick a position and an alternative, the branch runs (the real
`LLM.branch` on the tiny llama, and a scripted source for the busy and error states)."""

from __future__ import annotations

import math

import pytest

from tests.engine.helpers import greedy, make_llm
from workbench.errors import ValidationError
from workbench.widgets import TokenExplorer
from workbench.widgets.token_explorer import render

PROMPT = ("The quick brown fox jumps over the lazy dog, and then it runs far away into the "
          "deep green forest where")


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return make_llm(tiny_llama, seed=0)


@pytest.fixture(scope="module")
def output(llm):
    return llm.generate(PROMPT, greedy(6, logprobs=3))[0]


class Scripted:
    """A source whose `branch` records the explorer's state during the call, then answers
    with the real LLM's branch or raises `error`."""

    def __init__(self, llm, explorer_ref: list, error: Exception | None = None):
        self.llm, self.ref, self.error, self.calls = llm, explorer_ref, error, []

    def get_tokenizer(self):
        return self.llm.get_tokenizer()

    def branch(self, output, position, tokens, index=0):
        ex = self.ref[0]
        self.calls.append((position, tokens, ex.busy, ex.button.disabled, ex.position.disabled,
                           "wb-busy" in ex.status.value, "wb-dimmed" in ex.view.value))
        if self.error is not None:
            raise self.error
        return self.llm.branch(output, position, tokens=tokens, index=index)


def test_children_and_the_first_position(llm, output):
    ex = TokenExplorer(llm, output, top=2)
    assert ex.children[0] is ex.position and ex.children[-1] is ex.view
    assert (ex.position.min, ex.position.max, ex.position.value) == (0, 5, 0)
    chosen = output.outputs[0].token_ids[0]
    lps = output.outputs[0].logprobs[0]
    want = sorted((t for t in lps if t != chosen), key=lambda t: -lps[t].logprob)[:2]
    assert [v for _, v in ex.alternative.options] == want and ex.alternative.value is None
    assert "position 0:" in ex.view.value and not ex.busy and ex.tree.branches == []


def test_picking_an_alternative_runs_its_branch(llm, output):
    ex = TokenExplorer(llm, output)
    ex.position.value = 2
    alt = ex.alternative.options[1][1]
    ex.alternative.value = alt  # what a click in the list does
    (branch,) = ex.tree.branches
    want = llm.branch(output, 2, tokens=[alt]).branches[0]
    assert ex.branch is branch and branch.token_id == alt and branch.position == 2
    assert branch.path.token_ids == want.path.token_ids
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(branch.path.logprobs[2:],
                                                                 want.path.logprobs[2:]))
    assert branch.output.num_cached_tokens > 0
    assert "branch at 2:" in ex.view.value and ex.status.value == "" and not ex.busy
    assert ex.tree.diverges_at(0) == 2


def test_a_click_on_a_token_selects_its_position(llm, output):
    ex = TokenExplorer(llm, output)
    assert 'data-pick="3"' in ex.view.value and "wb-pick" in ex.pick._dom_classes
    ex.pick.value = "3"
    assert ex.position.value == 3 and ex.pick.value == ""


def test_busy_while_the_branch_runs_then_idle(llm, output):
    ref: list = []
    source = Scripted(llm, ref)
    ex = TokenExplorer(source, output)
    ref.append(ex)
    ex.position.value = 1
    branch = ex.select(1, ex.alternative.options[0][1])
    assert source.calls == [(1, [branch.token_id], True, True, True, True, True)]
    assert not ex.busy and not ex.button.disabled and not ex.position.disabled
    ex.position.value = 0
    assert ex.select(1, branch.token_id) is branch  # run once: shown again, not rerun
    assert len(source.calls) == 1 and len(ex.tree.branches) == 1


def test_an_error_is_shown_in_the_widget_and_raised(llm, output):
    ref: list = []
    source = Scripted(llm, ref, ValidationError("bad token", parameter="tokens", value=7))
    ex = TokenExplorer(source, output)
    ref.append(ex)
    ex.position.value = 1
    alt = ex.alternative.options[0][1]
    with pytest.raises(ValidationError, match="bad token"):
        ex.select(1, alt)
    assert 'class="wb-error"' in ex.status.value and "bad token" in ex.status.value
    assert "parameter=tokens" in ex.status.value
    assert not ex.busy and ex.tree.branches == [] and ex.branch is None
    ex.position.value = 2
    ex.alternative.value = ex.alternative.options[0][1]  # a handler: shown, not raised
    assert "bad token" in ex.status.value and len(source.calls) == 2 and not ex.busy
    source.error = None
    ex.button.click()  # runs the selection again
    assert len(ex.tree.branches) == 1 and ex.status.value == ""


def test_refusals_of_the_widget_name_the_parameter(llm, output):
    with pytest.raises(ValidationError) as err:
        TokenExplorer(llm, output, top=0)
    assert err.value.parameter == "top"
    ex = TokenExplorer(llm, output)
    with pytest.raises(ValidationError) as err:
        ex.select(1, 10 ** 6)
    assert err.value.parameter == "token_id"
    with pytest.raises(ValidationError) as err:
        ex.run()
    assert err.value.parameter == "alternative" and "wb-error" in ex.status.value


def test_an_output_without_logprobs_asks_the_model(llm):
    plain = llm.generate(PROMPT, greedy(3))[0]
    ex = TokenExplorer(llm, plain, top=2)
    assert ex.alternative.options == () and "asks the model for the 2 best" in ex.status.value
    ex.position.value = 1
    ex.button.click()
    want = llm.branch(plain, 1, top=2)
    assert [v for _, v in ex.alternative.options] == [b.token_id for b in want.branches]
    assert ex.alternative.value == want.branches[0].token_id and ex.branch is ex.tree.branches[0]
    assert [b.path.token_ids for b in ex.tree.branches] == [b.path.token_ids
                                                            for b in want.branches]
    assert ex.status.value == "" and not ex.busy
    ex.alternative.value = want.branches[1].token_id  # run already: shown, not rerun
    assert ex.branch is ex.tree.branches[1] and len(ex.tree.branches) == 2


def test_a_position_with_only_the_sampled_token_says_so(llm):
    bare = llm.generate(PROMPT, greedy(3, logprobs=0))[0]
    ex = TokenExplorer(llm, bare)
    assert ex.alternative.options == () and "logprobs=6" in ex.status.value


def test_the_fallback_is_deterministic_static_html(llm, output):
    ex = TokenExplorer(llm, output)
    ex.position.value = 2
    ex.select(2, ex.alternative.options[0][1])
    html = ex.to_html()
    assert html == ex._repr_html_() == render(ex.tree, 2, ex.branch)
    assert "onclick" not in html and "branch at 2:" in html and "wb-theme" in html
