"""Delta merging, the async merge of several engine streams, `min_characters` hold-back."""

from __future__ import annotations

import asyncio

import pytest

from workbench.serving.streaming import (
    ChoiceDelta,
    hold_back,
    merge_async_iterators,
    merge_deltas,
)


def test_merge_deltas_concatenates_and_keeps_the_final_reason():
    merged = merge_deltas(0, [ChoiceDelta(0, "a", [1], [{1: "x"}]),
                              ChoiceDelta(0, "b", [2], [{2: "y"}], "stop", "b")])
    assert (merged.text, merged.token_ids, merged.finish_reason, merged.stop_reason) == \
        ("ab", [1, 2], "stop", "b")
    assert merged.logprobs == [{1: "x"}, {2: "y"}]


async def numbers(start: int, closed: list):
    try:
        for i in range(start, start + 3):
            await asyncio.sleep(0)
            yield i
    finally:
        closed.append(start)


async def test_merge_yields_every_item_with_its_source():
    closed: list = []
    items = [x async for x in merge_async_iterators(numbers(0, closed), numbers(10, closed))]
    assert sorted(items) == [(0, 0), (0, 1), (0, 2), (1, 10), (1, 11), (1, 12)]


async def test_closing_the_merge_closes_every_source():
    closed: list = []
    merged = merge_async_iterators(numbers(0, closed), numbers(10, closed))
    await anext(merged)
    await merged.aclose()
    await asyncio.sleep(0.01)
    assert sorted(closed) == [0, 10]


async def test_a_failing_source_raises_in_the_consumer():
    async def boom():
        yield 1
        raise RuntimeError("engine failed")

    with pytest.raises(RuntimeError, match="engine failed"):
        [x async for x in merge_async_iterators(boom(), numbers(0, []))]


async def deltas(*items: ChoiceDelta, error: Exception | None = None, closed: list | None = None):
    try:
        for item in items:
            yield item
        if error is not None:
            raise error
    finally:
        if closed is not None:
            closed.append(True)


def piece(index: int, text: str, token: int, finish: str | None = None) -> ChoiceDelta:
    return ChoiceDelta(index, text, [token], [{token: "lp"}], finish)


async def test_hold_back_merges_a_choice_until_it_has_min_characters():
    held = [d async for d in hold_back(deltas(
        piece(0, "ab", 1), piece(0, "c", 2), piece(0, "def", 3), piece(0, "g", 4),
        piece(0, "", 5, "length")), 4)]
    assert [(d.text, d.token_ids, d.finish_reason) for d in held] == [
        ("abcdef", [1, 2, 3], None), ("g", [4, 5], "length")]  # the finish flushes the rest
    assert held[0].logprobs == [{1: "lp"}, {2: "lp"}, {3: "lp"}]


async def test_hold_back_keeps_each_choice_apart():
    held = [d async for d in hold_back(deltas(
        piece(0, "aa", 1), piece(1, "bbb", 2), piece(0, "a", 3, "stop"), piece(1, "b", 4),
        piece(1, "", 5, "stop")), 3)]
    assert [(d.index, d.text, d.finish_reason) for d in held] == [
        (1, "bbb", None), (0, "aaa", "stop"), (1, "b", "stop")]


async def test_hold_back_sends_what_it_held_before_a_failure_and_closes_its_source():
    closed: list = []
    got = []
    with pytest.raises(RuntimeError, match="engine failed"):
        async for d in hold_back(deltas(piece(0, "ab", 1), error=RuntimeError("engine failed"),
                                        closed=closed), 10):
            got.append(d.text)
    assert got == ["ab"] and closed == [True]
    closed.clear()
    held = hold_back(deltas(piece(0, "abc", 1), piece(0, "d", 2), closed=closed), 1)
    assert (await anext(held)).text == "abc"
    await held.aclose()
    assert closed == [True]
