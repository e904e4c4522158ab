"""Property tests: however a stream is chunked, the parsers reassemble the same result.

Every real-looking output of `tool_parser_samples` is cut at every single position, and at
random sets of positions (hypothesis); the streamed content and calls must equal what the
parser finds in the whole output, and the streamed arguments of each call must be exactly
its final arguments (not merely equal JSON).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.serving.test_tool_parsers import REQUEST, stream
from tests.serving.tool_parser_samples import SAMPLES
from workbench.serving.tool_parsers import get_tool_parser


def expected(name: str, text: str):
    whole = get_tool_parser(name)().extract_tool_calls(text, REQUEST)
    return whole.content or "", [(c.function.name, c.function.arguments) for c in whole.tool_calls]


@pytest.mark.parametrize("name,text,content,calls", SAMPLES)
def test_every_single_cut(name, text, content, calls):
    want = expected(name, text)
    for cut in range(len(text) + 1):
        got_content, got_calls, _ = stream(name, text, [cut])
        assert (got_content, got_calls) == want, f"cut at {cut}: {text[:cut]!r}|{text[cut:]!r}"


@settings(max_examples=300, deadline=None)
@given(sample=st.sampled_from(SAMPLES), data=st.data())
def test_random_chunkings(sample, data):
    name, text = sample[0], sample[1]
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=len(text)))
    got_content, got_calls, _ = stream(name, text, cuts)
    assert (got_content, got_calls) == expected(name, text)


ALPHABET = st.sampled_from(['<tool_call>', '</tool_call>', '[TOOL_CALLS]', '[ARGS]', '<|python_tag|>',
                            '<|tool_call|>', '<tool_calls>', 'functools',
                            '<function=f>', '<parameter=a>', '</parameter>', '</function>', '{',
                            '}', '[', ']', '(', ')', '"', "'", ':', ',', ';', '=', '\\', ' ',
                            '\n', 'name', 'arguments', 'f', '1', 'true', 'x'])


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(["hermes", "llama3_json", "mistral", "pythonic", "qwen3_xml",
                             "granite", "jamba", "phi4_mini_json"]),
       pieces=st.lists(ALPHABET, max_size=40), data=st.data())
def test_no_output_makes_a_parser_raise(name, pieces, data):
    """Whatever the model writes, whole or in any chunks: a result, never an exception, and
    the stream's shape holds (each call named once, before its argument fragments)."""
    text = "".join(pieces)
    get_tool_parser(name)().extract_tool_calls(text, REQUEST)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    stream(name, text, cuts)
