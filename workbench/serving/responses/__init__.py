"""The Responses API (`/v1/responses`): items, the built-in tool loop, events and the store.

`serving.py` (`ResponsesServing`: create, stream, retrieve, cancel), `loop.py` (`ToolLoop`,
the rounds of generate / built-in tool, and `ToolSet`), `parsing.py` (one round's text ->
reasoning, content, tool calls, with the server's parsers), `events.py` (`OutputBuilder`:
output items and their stream events together), `items.py` (input items <-> chat messages),
`checks.py` (refusals by name), `store.py` (`ResponseStore`, a bounded LRU per app).
"""

from workbench.serving.responses.loop import ToolLoop, ToolRound, ToolSet
from workbench.serving.responses.serving import ResponsesServing
from workbench.serving.responses.store import ResponseStore

__all__ = ["ResponseStore", "ResponsesServing", "ToolLoop", "ToolRound", "ToolSet"]
