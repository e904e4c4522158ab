"""`OutputBuilder`: a response's output items and the stream events that build them, together.

Both paths use it: the non-streaming response keeps `items`, the stream also sends `events`.
So streamed items equal returned items by construction. The event order is the reference's:
per item `response.output_item.added`, for text `response.content_part.added` ->
`response.output_text.delta`... -> `response.output_text.done` -> `response.content_part.done`
(reasoning the same with `reasoning_text`), for calls `response.function_call_arguments.delta`
... -> `.done`, then `response.output_item.done`. Sequence numbers are added by the stream.
"""

from __future__ import annotations

import copy
from typing import Any

from workbench.serving.responses import items as it


class OutputBuilder:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being written
        self._text = ""  # its text (message, reasoning) or arguments (function call)
        self._logprobs: list[dict[str, Any]] = []  # the open message's token logprobs

    def drain(self) -> list[dict[str, Any]]:
        """The events produced since the last drain."""
        events, self.events = self.events, []
        return events

    def _emit(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, "sequence_number": -1, **fields})

    @property
    def _index(self) -> int:
        return len(self.items) - 1

    def _start(self, item: dict[str, Any]) -> None:
        self.close()
        self.items.append(item)
        self._emit("response.output_item.added", output_index=self._index,
                   item=copy.deepcopy(item))
        self._open, self._text, self._logprobs = item, "", []

    # -- message and reasoning text ---------------------------------------------------------
    def _open_text(self, kind: str) -> dict[str, Any]:
        """The open item of `kind`, opened if another one (or none) is."""
        if self._open is not None and self._open["type"] == kind:
            return self._open
        item = (it.message_item("", status="in_progress") if kind == "message"
                else it.reasoning_item("", status="in_progress"))
        item["content"] = []
        self._start(item)
        part = ({"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                if kind == "message" else {"type": "reasoning_text", "text": ""})
        self._emit("response.content_part.added", item_id=item["id"], output_index=self._index,
                   content_index=0, part=part)
        return item

    def text(self, delta: str, logprobs: list[dict[str, Any]] | None = None) -> None:
        """Message text; `logprobs` (include=['message.output_text.logprobs']): one entry per
        token of the delta (a token with no text still sends a delta, so none is lost)."""
        if not delta and not logprobs:
            return
        item = self._open_text("message")
        self._logprobs += logprobs or []
        self._text += delta
        stream = [{k: v for k, v in entry.items() if k != "bytes"} | {"top_logprobs": [
            {"token": t["token"], "logprob": t["logprob"]} for t in entry["top_logprobs"]]}
            for entry in logprobs or []]  # the stream's shape has no bytes
        self._emit("response.output_text.delta", item_id=item["id"],
                   output_index=self._index, content_index=0, delta=delta, logprobs=stream)

    def reasoning(self, delta: str) -> None:
        self._delta("reasoning", "response.reasoning_text.delta", delta)

    def empty_message(self) -> None:
        self._open_text("message")

    def _delta(self, kind: str, event: str, delta: str, **extra: Any) -> None:
        if not delta:
            return
        item = self._open_text(kind)
        self._text += delta
        self._emit(event, item_id=item["id"], output_index=self._index, content_index=0,
                   delta=delta, **extra)

    # -- function calls and their outputs ---------------------------------------------------
    def call(self, delta: Any) -> None:
        """A tool-call stream piece (`DeltaToolCall`): the first one of a call opens its item."""
        if delta.id is not None:
            self._start(it.function_call_item(delta.id, delta.function.name, "",
                                              status="in_progress"))
        fragment = delta.function.arguments if delta.function is not None else None
        if fragment and self._open is not None and self._open["type"] == "function_call":
            self._text += fragment
            self._emit("response.function_call_arguments.delta", item_id=self._open["id"],
                       output_index=self._index, delta=fragment)

    def function_call_output(self, call_id: str, output: str) -> dict[str, Any]:
        self.close()
        item = it.function_call_output_item(call_id, output)
        self.items.append(item)
        self._emit("response.output_item.added", output_index=self._index,
                   item=copy.deepcopy(item))
        self._emit("response.output_item.done", output_index=self._index,
                   item=copy.deepcopy(item))
        return item

    # -- closing ----------------------------------------------------------------------------
    def close(self) -> None:
        """Ends the open item (its `.done` events)."""
        item, self._open = self._open, None
        if item is None:
            return
        text, kind, ident, index = self._text, item["type"], item["id"], self._index
        if kind == "function_call":
            done = it.function_call_item(item["call_id"], item["name"], text, ident)
            self._emit("response.function_call_arguments.done", item_id=ident,
                       output_index=index, name=item["name"], arguments=text)
        elif kind == "message":
            done = it.message_item(text, ident)
            done["content"] = [{"type": "output_text", "text": text, "annotations": [],
                                "logprobs": self._logprobs}]
            self._emit("response.output_text.done", item_id=ident, output_index=index,
                       content_index=0, text=text, logprobs=copy.deepcopy(self._logprobs))
        else:
            done = it.reasoning_item(text, ident)
            self._emit("response.reasoning_text.done", item_id=ident, output_index=index,
                       content_index=0, text=text)
        if kind != "function_call":
            self._emit("response.content_part.done", item_id=ident, output_index=index,
                       content_index=0, part=copy.deepcopy(done["content"][0]))
        self.items[index] = done
        self._emit("response.output_item.done", output_index=index, item=copy.deepcopy(done))
