"""`BeamTree`: plain data, frames, deterministic SVG, a matplotlib plot (tiny random llama)."""

from __future__ import annotations

import re

import pytest

from tests.engine.helpers import make_llm
from workbench.inspect.beam_tree import BeamTree
from workbench.sampling_params import BeamSearchParams

PARAMS = BeamSearchParams(beam_width=2, max_tokens=4, length_penalty=1.0)


@pytest.fixture(scope="module")
def result(tiny_llama):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield make_llm(tiny_llama).beam_search("Once upon a time", PARAMS)[0]
    torch.set_num_threads(before)


def test_every_candidate_of_every_step_is_a_node(result):
    tree = result.tree
    assert len(tree) == 4 + 3 * 2 * 4  # step 1 expands the prompt, then 2 beams x 4 candidates
    assert [n.id for n in tree] == list(range(len(tree)))
    assert {n.status for n in tree} <= {"kept", "pruned", "completed"}
    assert all(tree[i].rank == i + 1 for i in range(4)) and tree[0].parent is None
    assert tree[-1] is tree.nodes[-1]


def test_best_and_paths_follow_the_returned_sequences(result):
    tree = result.tree
    n = len(result.prompt_token_ids)
    for i, seq in enumerate(result.sequences):
        path = tree.path(i)
        assert [node.step for node in path] == list(range(1, len(path) + 1))
        assert all(b.parent == a.id for a, b in zip(path, path[1:]))
        assert [node.token_id for node in tree.path(i)] == seq.tokens[n:]
    assert tree.best.returned == 0 and tree.best.cum_logprob == result.sequences[0].cum_logprob


def test_to_dict_round_trips_and_to_frame_has_a_row_per_node(result):
    tree = result.tree
    assert BeamTree.from_dict(tree.to_dict()) == tree
    frame = tree.to_frame()
    assert len(frame) == len(tree)
    assert {"step", "token_id", "text", "logprob", "cum_logprob", "parent", "rank", "status",
            "score"} <= set(frame.columns)
    # integers stay integers, <NA> where there is none (pandas' nullable Int64, not NaN floats)
    assert {str(frame[c].dtype) for c in ("parent", "rank", "returned")} == {"Int64"}
    assert frame["parent"].isna().sum() == len(tree.children(None))
    assert frame["returned"].notna().sum() == len(tree.returned)


def test_repr_is_one_line(result):
    text = repr(result.tree)
    assert "\n" not in text and text.startswith("BeamTree(width=2, steps=4")


def test_html_is_deterministic_inline_svg(result, tiny_llama):
    again = make_llm(tiny_llama).beam_search("Once upon a time", PARAMS)[0]
    html = result.tree._repr_html_()
    assert html == again.tree._repr_html_()
    live = result.tree.to_svg()
    assert live.startswith('<div class="wb-drawing"') and "http" not in live.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")
    assert re.search(r'id="wb-beamtree-[0-9a-f]{10}"', html)
    assert live in html  # and a picture copy for untrusted notebooks
    every = result.tree.to_svg(expanded=True)
    assert every.count('<g class="wb-candidate"') == len(result.tree)  # each node, none folded
    assert every.count("<g><title>") == 1  # and the prompt


def test_plot_draws_with_matplotlib(result):
    import matplotlib

    matplotlib.use("Agg")
    ax = result.tree.plot()
    assert len(ax.lines) == len(result.tree)
    # pruned candidates in the grey that reads on light and dark pages (lightgrey did not)
    from matplotlib.colors import to_hex

    from workbench.display.figure import GREY
    pruned = {n.id for n in result.tree.nodes if n.status == "pruned"}
    assert pruned and to_hex(GREY) in {to_hex(line.get_color()) for line in ax.lines}
    import matplotlib.pyplot as plt

    plt.close(ax.figure)
