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
