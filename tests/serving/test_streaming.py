"""Delta merging and the async merge of several engine streams."""

from __future__ import annotations

import asyncio

import pytest

from workbench.serving.streaming import ChoiceDelta, merge_async_iterators, merge_deltas


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
