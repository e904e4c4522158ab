"""From engine outputs to choices: the pieces streaming and non-streaming responses share.

A streaming request runs the engine in DELTA mode, a non-streaming one in FINAL_ONLY (one
cumulative output when it finishes, as vLLM asks). Each engine output becomes `ChoiceDelta`s
(new text, token ids and logprobs of one choice); a streaming response turns every delta into
a chunk, a non-streaming one merges a choice's deltas (here: its one) and builds its choice
with the same function. So streamed text equals non-streamed text by construction.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from workbench.serving.protocol.common import ErrorResponse, UsageInfo


@dataclass
class ChoiceDelta:
    """What one engine step added to one choice (or, merged, the whole choice)."""

    index: int  # choice index in the response: prompt_index * n + output.index
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Any]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # what the request's capture / logit lens recorded: on the delta that finishes the choice
    activations: Any = None  # `workbench.inside.recorded.ActivationData`
    logit_lens: Any = None  # `workbench.inside.recorded.LogitLensData`
    features: Any = None  # `workbench.inside.recorded.FeatureData`
    token_stats: list[Any] | None = None  # `TokenStats` beside `logprobs`, when asked

    def extend(self, delta: "ChoiceDelta") -> None:
        """Appends a later delta of the same choice; its finish/stop reason wins."""
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(delta.logprobs)
        if delta.token_stats is not None:
            self.token_stats = (self.token_stats or []) + delta.token_stats
        if delta.finish_reason is not None:
            self.finish_reason, self.stop_reason = delta.finish_reason, delta.stop_reason
        if delta.activations is not None:
            self.activations = delta.activations
        if delta.logit_lens is not None:
            self.logit_lens = delta.logit_lens
        if delta.features is not None:
            self.features = delta.features


def choice_deltas(output: Any, prompt_index: int, n: int) -> list[ChoiceDelta]:
    """The deltas carried by one DELTA-mode `RequestOutput`; a finished output's activations
    and logit lens (a capture runs with n=1) go on the delta that finishes its choice."""
    activations = getattr(output, "activations", None)
    lens = getattr(output, "logit_lens", None)
    features = getattr(output, "features", None)
    return [
        ChoiceDelta(index=prompt_index * n + o.index, text=o.text or "",
                    token_ids=list(o.token_ids or []),
                    logprobs=None if o.logprobs is None else list(o.logprobs),
                    token_stats=None if getattr(o, "token_stats", None) is None
                    else list(o.token_stats),
                    finish_reason=o.finish_reason, stop_reason=o.stop_reason,
                    activations=activations if o.finish_reason is not None else None,
                    logit_lens=lens if o.finish_reason is not None else None,
                    features=features if o.finish_reason is not None else None)
        for o in output.outputs
    ]


def inside_fields(delta: ChoiceDelta) -> dict[str, Any]:
    """A choice's `activations`, `logit_lens` and `features` in wire form (`to_wire()`), those it has:
    the whole choice of a response, or the streamed piece that finishes it."""
    fields: dict[str, Any] = {}
    if delta.activations is not None:
        fields["activations"] = delta.activations.to_wire()
    if delta.logit_lens is not None:
        fields["logit_lens"] = delta.logit_lens.to_wire()
    if delta.features is not None:
        fields["features"] = delta.features.to_wire()
    return fields


def merge_deltas(index: int, deltas: list[ChoiceDelta]) -> ChoiceDelta:
    """Concatenates a choice's deltas into one; the last finish/stop reason wins."""
    merged = ChoiceDelta(index=index)
    for delta in deltas:
        merged.extend(delta)
    return merged


async def hold_back(deltas: AsyncGenerator[ChoiceDelta, None], min_characters: int
                    ) -> AsyncGenerator[ChoiceDelta, None]:
    """`stream_options.min_characters`: each choice's deltas merged until their text has at
    least `min_characters` characters (counted before reasoning and tool calls are parsed out
    of it). A finishing delta goes out at once with what was held, so a choice's last piece may
    be shorter; what is held when the source fails goes out before the error."""
    held: dict[int, ChoiceDelta] = {}
    try:
        async with aclosing(deltas):
            async for delta in deltas:
                pending = held.setdefault(delta.index, ChoiceDelta(index=delta.index))
                pending.extend(delta)
                if len(pending.text) >= min_characters or pending.finish_reason is not None:
                    yield held.pop(delta.index)
    except Exception:
        for pending in held.values():
            if pending.text or pending.token_ids:
                yield pending
        raise
    for pending in held.values():  # a source that ended without finishing its choices
        if pending.text or pending.token_ids:
            yield pending


async def merge_async_iterators(*iterators: AsyncGenerator[Any, None]
                                ) -> AsyncGenerator[tuple[int, Any], None]:
    """Yields `(i, item)` from several async iterators as items arrive.

    Closing the merged iterator (or cancelling its consumer) cancels every producer, so each
    source's own cleanup (aborting its engine request) runs.
    """
    if len(iterators) == 1:
        async with aclosing(iterators[0]) as only:
            async for item in only:
                yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def drain(i: int, iterator: AsyncIterator[Any]) -> None:
        try:
            async for item in iterator:
                await queue.put((i, item, None))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            await queue.put((i, None, exc))
        finally:
            await queue.put((i, done, None))

    tasks = [asyncio.ensure_future(drain(i, it)) for i, it in enumerate(iterators)]
    remaining = len(tasks)
    try:
        while remaining:
            i, item, exc = await queue.get()
            if exc is not None:
                raise exc
            if item is done:
                remaining -= 1
                continue
            yield i, item
    finally:
        for task in tasks:
            task.cancel()


def chunk_json(chunk: BaseModel) -> str:
    """A stream chunk as vLLM writes it: fields never assigned are left out."""
    return chunk.model_dump_json(exclude_unset=True)


def usage_chunk_json(chunk: BaseModel) -> str:
    """The trailing usage chunk: `choices: []`, nulls dropped."""
    return chunk.model_dump_json(exclude_unset=False, exclude_none=True)


def error_json(response: ErrorResponse) -> str:
    """An error after the 200 header went out: `{"error": {...}}` as one event."""
    return response.model_dump_json()


def usage_info(prompt_tokens: int, completion_tokens: int) -> UsageInfo:
    return UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                     total_tokens=prompt_tokens + completion_tokens)


def usage_options(stream_options: Any, force: bool) -> tuple[bool, bool]:
    """(include a usage chunk, put usage on every chunk), from `stream_options` and the
    server's `--enable-force-include-usage`."""
    include = force or bool(stream_options and stream_options.include_usage)
    continuous = include and (force or bool(stream_options and stream_options.continuous_usage_stats))
    return include, continuous
