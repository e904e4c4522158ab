"""`OutputBuilder`: a response's output items and the stream events that build them, together.

Both paths use it: the non-streaming response keeps `items`, the stream also sends `events`.
So streamed items equal returned items by construction. The event order is the reference's:
per item `response.output_item.added`, for text `response.content_part.added` ->
`response.output_text.delta`... -> `response.output_text.done` -> `response.content_part.done`
(reasoning the same with `reasoning_text`), for calls `response.function_call_arguments.delta`
-> `.done`, then `response.output_item.done`. Sequence numbers are added by the stream.
"""

from __future__ import annotations

import copy
from typing import Any

from workbench.serving.responses import items as it


class OutputBuilder:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the message or reasoning item being written
        self._text = ""

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
        self.items.append(item)
        self._emit("response.output_item.added", output_index=self._index,
                   item=copy.deepcopy(item))

    def _open_text(self, kind: str) -> None:
        if self._open is not None and self._open["type"] == kind:
            return
        self.close()
        item = (it.message_item("", status="in_progress") if kind == "message"
                else it.reasoning_item("", status="in_progress"))
        part_type = "output_text" if kind == "message" else "reasoning_text"
        item["content"] = []
        self._start(item)
        part = {"type": part_type, "text": ""}
        if kind == "message":
            part.update(annotations=[], logprobs=[])
        self._emit("response.content_part.added", item_id=item["id"], output_index=self._index,
                   content_index=0, part=part)
        self._open, self._text = item, ""

    def text(self, delta: str) -> None:
        self._delta("message", "response.output_text.delta", delta)

    def reasoning(self, delta: str) -> None:
        self._delta("reasoning", "response.reasoning_text.delta", delta)

    def _delta(self, kind: str, event: str, delta: str) -> None:
        if not delta:
            return
        self._open_text(kind)
        self._text += delta
        extra = {"logprobs": []} if kind == "message" else {}
        self._emit(event, item_id=self._open["id"], output_index=self._index, content_index=0,
                   delta=delta, **extra)

    def empty_message(self) -> None:
        self._open_text("message")

    def close(self) -> None:
        """Ends the open message or reasoning item (its `.done` events)."""
        item, self._open = self._open, None
        if item is None:
            return
        text, kind = self._text, item["type"]
        done = it.message_item(text, item["id"]) if kind == "message" else it.reasoning_item(
            text, item["id"])
        done["content"] = done["content"] or ([{"type": "output_text", "text": "",
                                                "annotations": [], "logprobs": []}]
                                              if kind == "message" else [])
        self.items[self._index] = done
        if kind == "message":
            self._emit("response.output_text.done", item_id=item["id"], output_index=self._index,
                       content_index=0, text=text, logprobs=[])
        else:
            self._emit("response.reasoning_text.done", item_id=item["id"],
                       output_index=self._index, content_index=0, text=text)
        self._emit("response.content_part.done", item_id=item["id"], output_index=self._index,
                   content_index=0, part=copy.deepcopy(done["content"][0]))
        self._emit("response.output_item.done", output_index=self._index,
                   item=copy.deepcopy(done))

    def function_call(self, call_id: str, name: str, arguments: str) -> dict[str, Any]:
        self.close()
        item = it.function_call_item(call_id, name, "", status="in_progress")
        self._start(item)
        self._emit("response.function_call_arguments.delta", item_id=item["id"],
                   output_index=self._index, delta=arguments)
        self._emit("response.function_call_arguments.done", item_id=item["id"],
                   output_index=self._index, name=name, arguments=arguments)
        done = it.function_call_item(call_id, name, arguments, item["id"])
        self.items[self._index] = done
        self._emit("response.output_item.done", output_index=self._index,
                   item=copy.deepcopy(done))
        return done

    def function_call_output(self, call_id: str, output: str) -> dict[str, Any]:
        self.close()
        item = it.function_call_output_item(call_id, output)
        self._start(item)
        self._emit("response.output_item.done", output_index=self._index,
                   item=copy.deepcopy(item))
        return item
