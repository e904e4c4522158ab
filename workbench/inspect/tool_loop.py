"""`ToolLoopTrace`: the rounds of one Responses API answer, tool by tool.

Each round is one engine sub-request (`<response id>_<round>`) at a priority, with its prompt
and output token counts, the raw text the model wrote, and the tool calls it made: for a
built-in tool its arguments and the output handed back to the model (an `Error: ...` when the
tool refused its input); a client function call has no output (the client runs it). Build it
from the serving loop (`from_loop`, everything) or from any response body (`from_response`:
what the body carries, e.g. from a remote server). Ids vary run to run: notebooks mask them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from workbench.display import html as h
from workbench.display.figure import neutral
from workbench.display.frames import frame


@dataclass(frozen=True)
class LoopCall:
    """One tool call of a round."""

    name: str
    arguments: str
    builtin: bool
    output: str | None = None  # None: a client function tool (or the loop stopped first)
    error: bool = False

    @property
    def parsed_arguments(self) -> Any:
        try:
            return json.loads(self.arguments)
        except json.JSONDecodeError:
            return None


@dataclass(frozen=True)
class LoopRound:
    """One generation round (engine sub-request) and the calls it made."""

    index: int
    request_id: str
    priority: int | None
    prompt_tokens: int | None
    output_tokens: int | None
    finish_reason: str | None
    text: str | None  # what the model wrote (None when built from a response body)
    calls: tuple[LoopCall, ...] = ()


@dataclass(frozen=True)
class ToolLoopTrace:
    """The rounds of one response.

    >>> t = ToolLoopTrace.from_response({"id": "resp_1", "status": "completed", "output": [
    ...     {"type": "function_call", "call_id": "c", "name": "calculator",
    ...      "arguments": '{"expression": "6*7"}'},
    ...     {"type": "function_call_output", "call_id": "c", "output": "42"},
    ...     {"type": "message", "content": [{"type": "output_text", "text": "42."}]}]})
    >>> len(t), t.calls[0].output, t.output_text
    (2, '42', '42.')
    """

    response_id: str
    status: str
    incomplete_reason: str | None
    rounds: tuple[LoopRound, ...]
    output_text: str = ""

    @classmethod
    def from_loop(cls, loop: Any) -> "ToolLoopTrace":
        """From a finished `workbench.serving.responses.ToolLoop` (every detail)."""
        rounds = tuple(
            LoopRound(r.index, r.request_id, r.priority, r.prompt_tokens, r.output_tokens,
                      r.finish_reason, r.text,
                      tuple(LoopCall(c.name, c.arguments, c.builtin, c.output, c.error)
                            for c in r.calls))
            for r in loop.rounds)
        text = "".join(p.get("text", "") for item in loop.builder.items
                       if item["type"] == "message" for p in item["content"])
        return cls(loop.response_id, loop.status, loop.incomplete_reason, rounds, text)

    @classmethod
    def from_response(cls, body: dict[str, Any]) -> "ToolLoopTrace":
        """From a response body: a round ends after each batch of tool outputs; token counts
        come from `usage`'s per-turn lists when the server sends them (ours does)."""
        outputs = {i["call_id"]: i["output"] for i in body.get("output", [])
                   if i.get("type") == "function_call_output"}
        groups: list[list[dict[str, Any]]] = [[]]
        for item in body.get("output", []):  # after tool outputs, the next item is a new round
            after_outputs = groups[-1] and groups[-1][-1].get("type") == "function_call_output"
            if after_outputs and item.get("type") != "function_call_output":
                groups.append([])
            groups[-1].append(item)
        usage = body.get("usage") or {}
        inputs = (usage.get("input_tokens_details") or {}).get("input_tokens_per_turn") or []
        outs = (usage.get("output_tokens_details") or {}).get("output_tokens_per_turn") or []
        rounds = []
        for index, group in enumerate(g for g in groups if g):
            calls = tuple(LoopCall(i["name"], i.get("arguments", ""), i["call_id"] in outputs,
                                   outputs.get(i["call_id"]),
                                   str(outputs.get(i["call_id"], "")).startswith("Error: "))
                          for i in group if i.get("type") == "function_call")
            rounds.append(LoopRound(index, f"{body.get('id')}_{index}", None,
                                    inputs[index] if index < len(inputs) else None,
                                    outs[index] if index < len(outs) else None, None, None,
                                    calls))
        text = "".join(p.get("text", "") for item in body.get("output", [])
                       if item.get("type") == "message" for p in item.get("content", []))
        reason = (body.get("incomplete_details") or {}).get("reason")
        return cls(body.get("id", ""), body.get("status", ""), reason, tuple(rounds), text)

    # -- access -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rounds)

    def __getitem__(self, index: int) -> LoopRound:
        return self.rounds[index]

    @property
    def calls(self) -> list[LoopCall]:
        return [call for r in self.rounds for call in r.calls]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def rows(self) -> list[dict[str, Any]]:
        """One row per tool call (a round without calls: one row with no tool)."""
        rows = []
        for r in self.rounds:
            base = {"round": r.index, "request_id": r.request_id, "priority": r.priority,
                    "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
                    "finish_reason": r.finish_reason}
            for call in r.calls or (None,):
                rows.append({**base, "tool": call and call.name,
                             "builtin": call and call.builtin,
                             "arguments": call and call.arguments,
                             "output": call and call.output, "error": call and call.error})
        return rows

    def to_frame(self):
        return frame(self.rows(), ["round", "request_id", "priority", "prompt_tokens",
                                   "output_tokens", "finish_reason", "tool", "builtin",
                                   "arguments", "output", "error"],
                     {**dict.fromkeys(["priority", "prompt_tokens", "output_tokens"], "Int64"),
                      **dict.fromkeys(["request_id", "finish_reason", "tool", "arguments",
                                       "output", "error"], "string"), "builtin": "boolean"})

    def __repr__(self) -> str:
        tools = ", ".join(c.name for c in self.calls) or "no tools"
        return (f"ToolLoopTrace({self.status}, {len(self.rounds)} rounds, {tools}"
                + (f", incomplete: {self.incomplete_reason})" if self.incomplete_reason else ")"))

    def _repr_html_(self) -> str:
        rows = []
        for row in self.rows():
            tool = row["tool"] or "—"
            if row["tool"] and not row["builtin"]:
                tool += " (client)"
            output = row["output"]
            shown = "—" if output is None else output
            color = h.ERROR if row["error"] else "inherit"
            rows.append((row["round"], h.escape(row["request_id"]),
                         "—" if row["priority"] is None else row["priority"],
                         "—" if row["prompt_tokens"] is None else row["prompt_tokens"],
                         "—" if row["output_tokens"] is None else row["output_tokens"],
                         h.escape(tool), f"<code>{h.escape(row['arguments'] or '—')}</code>",
                         f'<span style="color:{color}">{h.escape(shown)}</span>'))
        status = h.escape(self.status) + (f" ({h.escape(self.incomplete_reason)})"
                                          if self.incomplete_reason else "")
        stable = [{k: v for k, v in row.items() if k != "request_id"} for row in self.rows()]
        ident = h.content_id("wb-toolloop", stable, self.output_text)  # ids vary run to run
        return (f'<div id="{ident}"><div style="font-size:12px">Tool loop: {len(self.rounds)} '
                f"round(s), {len(self.calls)} call(s), status {status}</div>"
                + h.table(["round", "sub-request", "priority", "prompt tokens", "output tokens",
                           "tool", "arguments", "output"], rows, escape_cells=False)
                + f'<div style="font-size:12px">answer: {h.escape(self.output_text)}</div></div>')

    def plot(self, ax: Any = None) -> Any:
        """Prompt and output tokens per round, stacked (matplotlib; unknown counts as 0), each
        round labelled with its tools; returns the axes."""
        import matplotlib.pyplot as plt  # optional: deferred, only plots need matplotlib

        if ax is None:
            _, ax = plt.subplots(figsize=(1.5 + 1.2 * max(len(self.rounds), 1), 3))
        index = [r.index for r in self.rounds]
        prompt = [r.prompt_tokens or 0 for r in self.rounds]
        ax.bar(index, prompt, color="#8fb8de", label="prompt tokens")
        ax.bar(index, [r.output_tokens or 0 for r in self.rounds], bottom=prompt,
               color="#f0a868", label="output tokens")
        ax.set_xticks(index, [f"{r.index}: " + (", ".join(c.name for c in r.calls) or "—")
                              for r in self.rounds], fontsize=8)
        ax.set_xlabel("round: tools called")
        ax.set_ylabel("tokens")
        ax.legend(fontsize=8)
        ax.set_title(repr(self), fontsize=9)
        return neutral(ax)
