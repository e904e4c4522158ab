"""IncrementalDetokenizer with the real SmolLM2 tokenizer: UTF-8 safety, spacing, stop strings."""

import pytest

from workbench.engine.requests.detokenizer import IncrementalDetokenizer
from workbench.sampling_params import SamplingParams

MULTIBYTE = "héllo 你好 🙂"
PROMPT = "Say:"


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def feed(tokenizer, text: str, prompt: str = PROMPT, **params):
    """A detokenizer fed `text`'s tokens one by one; returns it and the text after each token."""
    detok = IncrementalDetokenizer(tokenizer, SamplingParams(**params), ids(tokenizer, prompt))
    texts = []
    for token in ids(tokenizer, text):
        detok.add(token)
        texts.append(detok.text)
    return detok, texts


def test_multibyte_characters_split_over_tokens_are_never_emitted_broken(tokenizer):
    tokens = ids(tokenizer, MULTIBYTE)
    assert any("\ufffd" in tokenizer.decode([t]) for t in tokens)  # the test really splits bytes
    detok, texts = feed(tokenizer, MULTIBYTE)
    assert all("\ufffd" not in t for t in texts)
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # text only grows
    assert detok.text == tokenizer.decode(tokens) == MULTIBYTE


def test_a_character_appears_once_its_last_byte_arrives(tokenizer):
    _, texts = feed(tokenizer, MULTIBYTE)
    assert "你" not in texts[4] and "你" in texts[6]


def test_spaces_between_words_survive_incremental_decoding(tokenizer):
    detok, _ = feed(tokenizer, " Hello world, how are you?")
    assert detok.text == " Hello world, how are you?"


def test_deltas_concatenate_to_the_text(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, SamplingParams(), ids(tokenizer, PROMPT))
    pieces = []
    for token in ids(tokenizer, MULTIBYTE):
        detok.add(token)
        pieces.append(detok.delta(finished=False))
    pieces.append(detok.delta(finished=True))
    assert "".join(pieces) == MULTIBYTE


def test_a_stop_string_truncates_the_text_and_is_reported(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, SamplingParams(stop=["你好"]), ids(tokenizer, PROMPT))
    matched = None
    for token in ids(tokenizer, MULTIBYTE):
        matched = detok.add(token)
        if matched:
            break
    assert matched == "你好"
    assert detok.text == "héllo "


def test_include_stop_str_in_output_keeps_the_stop_string(tokenizer):
    params = SamplingParams(stop=["llo"], include_stop_str_in_output=True)
    detok = IncrementalDetokenizer(tokenizer, params, ids(tokenizer, PROMPT))
    matched = [detok.add(t) for t in ids(tokenizer, MULTIBYTE)[:3]]
    assert matched[-1] == "llo" and detok.text == "héllo"


def test_a_stop_string_spanning_tokens_is_found(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, SamplingParams(stop=["lo wor"]), [])
    matched = [detok.add(t) for t in ids(tokenizer, "Hello world")]
    assert "lo wor" in matched and detok.text == "Hel"


def test_check_stops_false_ignores_stop_strings(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, SamplingParams(stop=["llo"]), [])
    assert all(detok.add(t, check_stops=False) is None for t in ids(tokenizer, "hello hello"))
    assert detok.text == "hello hello"


def test_streaming_holds_back_what_could_start_a_stop_string(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, SamplingParams(stop=["STOP!"]), [])
    for t in ids(tokenizer, " Hello world"):
        detok.add(t)
    assert detok.visible(finished=False) == " Hello w"  # the last 4 characters held back
    assert detok.delta(finished=False) == " Hello w"
    assert detok.delta(finished=True) == "orld"
    assert detok.visible(finished=True) == " Hello world"


@pytest.mark.parametrize("skip, expected", [(True, "Hi"), (False, "Hi<|im_end|>")])
def test_skip_special_tokens(tokenizer, skip, expected):
    params = SamplingParams(skip_special_tokens=skip, spaces_between_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, params, [])
    for t in ids(tokenizer, "Hi") + [tokenizer.convert_tokens_to_ids("<|im_end|>")]:
        detok.add(t)
    assert detok.text == expected


def test_spaces_between_special_tokens(tokenizer):
    params = SamplingParams(skip_special_tokens=False, spaces_between_special_tokens=True)
    detok = IncrementalDetokenizer(tokenizer, params, [])
    for t in ids(tokenizer, "Hi") + [tokenizer.convert_tokens_to_ids("<|im_end|>")]:
        detok.add(t)
    assert detok.text == "Hi <|im_end|>"


def test_flush_keeps_a_trailing_incomplete_character(tokenizer):
    tokens = ids(tokenizer, "你")
    detok = IncrementalDetokenizer(tokenizer, SamplingParams(), [])
    detok.add(tokens[0])
    if len(tokens) > 1:
        assert detok.text == ""
    detok.flush()
    assert detok.text == tokenizer.decode(tokens[:1])
