"""LogprobViewer headless: the slider selects a position; the HTML shows its alternatives."""

from __future__ import annotations

import pytest

from workbench.inspect.logprob_table import Alternative, LogprobRow, LogprobTable
from workbench.widgets import LogprobViewer


@pytest.fixture
def table() -> LogprobTable:
    return LogprobTable((
        LogprobRow(0, "Hello", -0.1, 1, 10, (Alternative("Hello", -0.1, 1),
                                             Alternative("Hi", -2.5, 2))),
        LogprobRow(1, " world", -1.5, 2, 11, (Alternative(" there", -0.4, 1),
                                              Alternative(" world", -1.5, 2))),
    ))


def test_slider_spans_the_generated_positions(table):
    viewer = LogprobViewer(table)
    assert viewer.children == (viewer.slider, viewer.view)
    assert (viewer.slider.min, viewer.slider.max, viewer.slider.value) == (0, 1, 0)
    assert "position 0 of 2: &#x27;Hello&#x27; logprob -0.1000, rank 1" in viewer.view.value


def test_moving_the_slider_shows_that_positions_alternatives(table):
    viewer = LogprobViewer(table)
    before = viewer.view.value
    viewer.slider.value = 1
    assert viewer.view.value != before
    assert "position 1 of 2" in viewer.view.value and "rank 2" in viewer.view.value
    assert "<b><span class=\"wb-token\" title=\"&#x27; world&#x27;\">␣world</span></b>" \
        in viewer.view.value and ">Hi<" not in viewer.view.value
    assert viewer.row is table[1]


def test_html_fallback_matches_the_view(table):
    viewer = LogprobViewer(table, position=1)
    assert viewer.to_html() == viewer._repr_html_() == viewer.view.value
    assert LogprobViewer(table, position=1).to_html() == viewer.to_html()


def test_from_response_reads_a_chat_body():
    body = {"object": "chat.completion", "choices": [{"index": 0, "logprobs": {"content": [
        {"token": "Hi", "logprob": -0.2, "top_logprobs": [{"token": "Hi", "logprob": -0.2},
                                                         {"token": "Yo", "logprob": -1.9}]}]}}]}
    viewer = LogprobViewer.from_response(body)
    assert len(viewer.table) == 1 and ">Yo<" in viewer.view.value


def test_an_empty_table_shows_a_note():
    viewer = LogprobViewer(LogprobTable(()))
    assert viewer.slider.max == 0 and "no generated positions" in viewer.view.value


def test_a_whitespace_alternative_is_a_visible_mark_with_the_raw_token_on_hover():
    table = LogprobTable((LogprobRow(0, "\n\n", -0.1, 1, 10, (Alternative("\n\n", -0.1, 1),
                                                              Alternative(" ", -2.5, 2))),))
    html = LogprobViewer(table).view.value
    assert '<span class="wb-token" title="&#x27; &#x27;">␣</span>' in html  # not a blank row
    assert 'title="&#x27;\\n\\n&#x27;"' in html and ">⏎⏎</span>" in html  # the strip too
