"""Deterministic HTML helpers."""

from workbench.display.html import content_id


def test_content_id_ignores_float_noise_but_not_visible_changes():
    a = content_id("wb-x", {"logprob": -0.5313242077827454, "tokens": ["Hello"]})
    b = content_id("wb-x", {"logprob": -0.5313287973403931, "tokens": ["Hello"]})
    c = content_id("wb-x", {"logprob": -0.6, "tokens": ["Hello"]})
    assert a == b != c and a.startswith("wb-x-")


def test_whitespace_and_control_characters_are_visible_marks():
    from workbench.display.html import token_html, visible

    assert visible(" ") == "␣" and visible("\n\n") == "⏎⏎" and visible("\t") == "⇥"
    assert visible(" London") == "␣London" and visible("") == "∅"
    assert visible("\x00") == "␀" and visible("\u200b") == "\\u200b"
    assert token_html(" ") == '<span class="wb-token" title="&#x27; &#x27;">␣</span>'
