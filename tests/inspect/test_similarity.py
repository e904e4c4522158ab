"""`SimilarityMatrix`: builders, access, frame, deterministic HTML, heatmap."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from workbench.inspect.similarity import SimilarityMatrix


def test_from_embeddings_is_cosine():
    m = SimilarityMatrix.from_embeddings([[1, 0], [1, 1], [0, 2]], ["a", "b", "c"])
    assert m.shape == (3, 3)
    assert m["a", "a"] == pytest.approx(1.0)
    assert m["a", "b"] == pytest.approx(1 / np.sqrt(2))
    assert m["a", "c"] == pytest.approx(0.0)
    assert m.best("a") == "b"  # itself skipped
    assert m.best("a", exclude_self=False) == "a"


def test_from_embedding_response_decodes_base64():
    vecs = np.array([[0.6, 0.8], [1.0, 0.0]], dtype="float32")
    response = {"data": [{"index": i, "embedding": base64.b64encode(v.tobytes()).decode()}
                         for i, v in enumerate(vecs)]}
    m = SimilarityMatrix.from_embedding_response(response, ["x", "y"])
    assert m["x", "y"] == pytest.approx(0.6, abs=1e-6)


def test_from_score_and_rerank_responses():
    score = {"data": [{"index": 1, "score": 0.2}, {"index": 0, "score": 0.9}]}
    one = SimilarityMatrix.from_score_response(score, ["q"], ["d0", "d1"])
    assert (one.rows, one.cols, one.values) == (["q"], ["d0", "d1"], [[0.9, 0.2]])
    pairs = SimilarityMatrix.from_score_response(score, ["q0", "q1"], ["d0", "d1"])
    assert pairs.rows == ["q0 | d0", "q1 | d1"] and pairs.values == [[0.9], [0.2]]
    rerank = {"results": [{"index": 2, "relevance_score": 0.8},
                          {"index": 0, "relevance_score": 0.5}]}
    m = SimilarityMatrix.from_rerank_response(rerank, "q", ["a", "b", "c"])
    assert (m.cols, m.values, m.kind) == (["a", "c"], [[0.5, 0.8]], "relevance")


def test_shape_is_checked():
    with pytest.raises(ValueError, match="values must be 1 rows of 2 columns"):
        SimilarityMatrix(["q"], ["a", "b"], [[0.1]])


def test_frame_and_dict():
    m = SimilarityMatrix(["q"], ["a", "b"], [[0.25, 0.75]], "score")
    frame = m.frame()
    assert list(frame.columns) == ["a", "b"] and frame.loc["q", "b"] == 0.75
    assert m.to_dict() == {"rows": ["q"], "cols": ["a", "b"], "kind": "score",
                           "values": [[0.25, 0.75]]}
    assert repr(m) == "SimilarityMatrix(score, 1x2)"


def test_html_is_deterministic_and_escaped():
    m = SimilarityMatrix(["<q>"], ["a & b", "c"], [[0.123456, 0.9]])
    html = m._repr_html_()
    assert html == SimilarityMatrix(["<q>"], ["a & b", "c"], [[0.123456, 0.9]])._repr_html_()
    assert "&lt;q&gt;" in html and "a &amp; b" in html and "0.1235" in html
    assert "<script" not in html and "wb-sim-" in html
    assert html != SimilarityMatrix(["<q>"], ["a & b", "c"], [[0.5, 0.9]])._repr_html_()


def test_plot_draws_a_heatmap():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = SimilarityMatrix.from_embeddings([[1, 0], [0, 1]], ["a", "b"])
    ax = m.plot()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]
    assert len(ax.texts) == 4 and ax.images[0].get_array().shape == (2, 2)
    plt.close(ax.figure)


def _cell_colours(html: str) -> list[str]:
    import re

    return re.findall(r'<td style="[^"]*background:(#[0-9a-f]{6})"', html)


@pytest.mark.parametrize("kind", ["cosine", "score", "relevance"])
def test_one_colour_scale_for_every_kind_in_table_and_heatmap(kind):
    """A value has the same colour in the table and the heatmap, 0..1 for every kind (a cosine
    of 0.02 and one of 0.67 look different), stated in the table's legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from tests.inspect.contrast import contrast
    from workbench.display import html as h

    values = [[1.0, 0.665, 0.083, 0.016, -0.2]]
    m = SimilarityMatrix(["q"], list("abcde"), values, kind)
    if kind == "cosine":
        m = SimilarityMatrix.from_embeddings([[1.0, 0.0]], ["q"], [[1.0, 0.0]], ["a"])
        m.values, m.cols = values, list("abcde")
    expected = [h.prob_color(min(max(v, 0.0), 1.0)) for v in values[0]]
    html = m._repr_html_()
    assert _cell_colours(html) == expected
    assert expected[3] == h.prob_color(0.016) != h.prob_color((0.016 + 1) / 2)  # not on -1..1
    assert f"{kind}, the colours of every similarity view" in html and "below 0.00 as 0.00" in html
    ax = m.plot()
    try:
        image = ax.images[0]
        drawn = [to_hex(image.cmap(image.norm(v))) for v in values[0]]
        for got, want in zip(drawn, expected):
            assert contrast(got, want) < 1.05, (got, want)  # the same colour (one step of 101)
    finally:
        plt.close(ax.figure)


def test_headers_wrap_and_are_cut_only_at_a_word_with_the_full_text_on_hover():
    import re

    short, long = "The market dropped at the open.", ("The market dropped at the open and "
                                                   "kept falling all afternoon until the close.")
    html = SimilarityMatrix([short], [short, long], [[1.0, 0.5]])._repr_html_()
    headers = re.findall(r"<th style=\"([^\"]*)\">(.*?)</th>", html)
    assert all("white-space:normal" in style for style, _ in headers)
    shown = [text for _, text in headers]
    assert short in shown  # whole, wrapping at its spaces, not "The market dropped at t…"
    cut = next(text for text in shown if "…" in text)
    assert f'title="{long}"' in cut
    visible = re.sub(r"<[^>]+>", "", cut).rstrip("…")
    assert long.startswith(visible) and long[len(visible)] == " "


def test_plot_tick_labels_are_cut_at_a_word():
    from workbench.inspect.similarity import _wrap

    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi"
    lines = _wrap(text, width=12, lines=2).split("\n")
    assert len(lines) == 2 and lines[-1].endswith("…")
    assert all(word in text.split() for line in lines for word in line.rstrip("…").split())
