"""`ResponseStore`: stored responses for `previous_response_id` and `GET /v1/responses/{id}`.

In memory, one per app, bounded: a least-recently-used map of at most `max_size` responses
(the reference keeps every response forever; its FIXMEs call that a memory leak). Each entry
holds the response and the conversation it ended (messages, instructions excluded, so a
follow-up's `instructions` replace them, as OpenAI's do). `max_size=0` disables storing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from workbench.serving.protocol.responses import ResponsesResponse


@dataclass
class StoredResponse:
    response: ResponsesResponse
    conversation: list[dict[str, Any]]  # the chat messages up to and including this output


class ResponseStore:
    """An LRU map `response id -> StoredResponse` (thread-safe; the facade and the server
    may share it).

    >>> store = ResponseStore(max_size=1)
    >>> store.put(ResponsesResponse(id="resp_a", model="m"), [])
    >>> store.put(ResponsesResponse(id="resp_b", model="m"), [])
    >>> store.get("resp_a") is None, len(store)
    (True, 1)
    """

    def __init__(self, max_size: int = 1000):
        if max_size < 0:
            raise ValueError(f"max_size must be non-negative, got {max_size}.")
        self.max_size = max_size
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_size > 0

    def put(self, response: ResponsesResponse, conversation: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._entries[response.id] = StoredResponse(response, conversation)
            self._entries.move_to_end(response.id)
            while len(self._entries) > self.max_size:
                self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._entries
