"""The two OpenAI logprob formats from engine positions (sampled token first, then top-k)."""

from __future__ import annotations

import math

from workbench.engine.requests.outputs import Logprob
from workbench.serving.logprobs import (
    chat_logprobs,
    completion_logprobs,
    positions_or_blank,
    prompt_logprobs_json,
)


class Decoder:
    def decode(self, ids):
        return {5: "a", 6: "b", 7: "a", 8: "é"}[ids[0]]


# sampled token 6 is ranked 3rd: top-2 are 5 and 7 (both decode to "a")
POSITION = {6: Logprob(-2.0, 3, "b"), 5: Logprob(-0.5, 1, "a"), 7: Logprob(-1.0, 2, "a")}


def test_completion_format_keeps_k_plus_one_entries_keyed_by_text():
    lp, end = completion_logprobs([6, 8], [POSITION, {8: Logprob(-math.inf, 9, "é")}], 2,
                                  Decoder(), initial_offset=3)
    assert lp.tokens == ["b", "é"]
    assert lp.token_logprobs == [-2.0, -9999.0]
    assert lp.top_logprobs[0] == {"b": -2.0, "a": -1.0}  # ids 5 and 7 collapse on "a"
    assert lp.text_offset == [3, 4] and end == 5


def test_chat_format_takes_the_first_k_entries_with_bytes():
    content = chat_logprobs([6], [POSITION], 2, Decoder()).content[0]
    assert (content.token, content.logprob, content.bytes) == ("b", -2.0, [98])
    assert [(t.token, t.logprob) for t in content.top_logprobs] == [("b", -2.0), ("a", -0.5)]


def test_token_ids_rendering():
    lp, _ = completion_logprobs([6], [POSITION], 0, Decoder(), as_token_ids=True)
    assert lp.tokens == ["token_id:6"] and lp.top_logprobs == [{"token_id:6": -2.0}]


def test_missing_positions_give_nulls():
    lp, _ = completion_logprobs([5], [None], 1, Decoder())
    assert (lp.token_logprobs, lp.top_logprobs) == ([None], [None])
    assert chat_logprobs([5], [None], 1, Decoder()).content[0].logprob == -9999.0


def test_prompt_logprobs_keep_the_leading_null_and_clamp():
    out = prompt_logprobs_json([None, {5: Logprob(-math.inf, 4, "a")}])
    assert out[0] is None and out[1][5].logprob == -9999.0 and out[1][5].rank == 4


def test_positions_or_blank_fills_missing_or_empty_positions():
    assert positions_or_blank([POSITION], 1) == [POSITION]
    assert positions_or_blank(None, 2) == [None, None]
    assert positions_or_blank([], 2) == [None, None]  # an empty list counts as missing
