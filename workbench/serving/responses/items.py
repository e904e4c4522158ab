"""Responses items <-> chat messages, and the output items' shapes.

`conversation(...)` turns a request's input (a string, or items: messages with `input_text` /
`output_text` parts, `function_call`, `function_call_output`, `reasoning`) after a stored
conversation into the chat messages the template renders, as the reference's
`construct_input_messages`: a `function_call` joins the previous assistant message's
`tool_calls`, a `function_call_output` becomes a `tool` message. `output_messages` does the
same for a response's own output items, so a stored response continues as it ended.
"""

from __future__ import annotations

import uuid
from typing import Any

from workbench.errors import ValidationError
from workbench.serving.chat_template import content_text

Message = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


# -- output items (OpenAI's shapes) ---------------------------------------------------------

def message_item(text: str, item_id: str | None = None, status: str = "completed") -> dict:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"id": item_id or new_id("msg"), "type": "message", "role": "assistant",
            "status": status, "content": content if text or status != "completed" else []}


def reasoning_item(text: str, item_id: str | None = None, status: str = "completed") -> dict:
    return {"id": item_id or new_id("rs"), "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}


def function_call_item(call_id: str, name: str, arguments: str, item_id: str | None = None,
                       status: str = "completed") -> dict:
    return {"id": item_id or new_id("fc"), "type": "function_call", "call_id": call_id,
            "name": name, "arguments": arguments, "status": status}


def function_call_output_item(call_id: str, output: str, item_id: str | None = None) -> dict:
    return {"id": item_id or new_id("fco"), "type": "function_call_output", "call_id": call_id,
            "output": output, "status": "completed"}


# -- items -> chat messages -----------------------------------------------------------------

def _tool_call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _append_call(messages: list[Message], call: dict) -> None:
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "tool_call_id" not in last:
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _item_text(item: dict, field: str = "content") -> str:
    parts = item.get(field) or []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


def append_item(messages: list[Message], item: dict, pending_reasoning: list[str]) -> None:
    """One input or output item onto `messages` (reasoning waits for the next assistant turn)."""
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise ValidationError(f"Unsupported message role: {role}", parameter="input")
        message: Message = {"role": role, "content": content_text(item.get("content")) or ""}
        if role == "assistant" and pending_reasoning:
            message["reasoning"] = "".join(pending_reasoning)
            pending_reasoning.clear()
        messages.append(message)
    elif kind == "function_call":
        for name in ("call_id", "name"):
            if not item.get(name):
                raise ValidationError(f"A function_call item needs `{name}`.", parameter="input")
        _append_call(messages, _tool_call(item["call_id"], item["name"],
                                          item.get("arguments") or "{}"))
    elif kind == "function_call_output":
        if not item.get("call_id"):
            raise ValidationError("A function_call_output item needs `call_id`.",
                                  parameter="input")
        output = item.get("output")
        messages.append({"role": "tool", "tool_call_id": item["call_id"],
                         "content": output if isinstance(output, str) else content_text(output)})
    elif kind == "reasoning":
        if item.get("encrypted_content"):
            raise ValidationError("Encrypted content is not supported.", parameter="input")
        pending_reasoning.append(_item_text(item) or _item_text(item, "summary"))
    else:
        raise ValidationError(f"Unsupported input item type: {kind}", parameter="input")


def conversation(request_input: str | list[dict], history: list[Message] | None = None
                 ) -> list[Message]:
    """The stored history, then this request's input, as chat messages (no instructions)."""
    messages = [dict(m) for m in history or []]
    if isinstance(request_input, str):
        messages.append({"role": "user", "content": request_input})
        return messages
    pending: list[str] = []
    for item in request_input:
        if not isinstance(item, dict):
            raise ValidationError("Input items must be objects.", parameter="input")
        append_item(messages, item, pending)
    if pending:  # reasoning with no assistant message after it
        messages.append({"role": "assistant", "content": "", "reasoning": "".join(pending)})
    return messages


def ends_unfinished(request_input: str | list[dict]) -> bool:
    """The input's last item is an assistant message or reasoning still `in_progress` or
    `incomplete`: the model continues it (a prefill) instead of starting a new turn."""
    if isinstance(request_input, str) or not request_input:
        return False
    last = request_input[-1]
    kind = last.get("type", "message" if "role" in last else None)
    assistant = kind == "reasoning" or (kind == "message" and last.get("role") == "assistant")
    return assistant and last.get("status") in ("in_progress", "incomplete")


def output_messages(output: list[dict]) -> list[Message]:
    """A response's output items as the chat messages that continue its conversation."""
    return conversation(output) if output else []


def with_instructions(messages: list[Message], instructions: str | None) -> list[Message]:
    return ([{"role": "system", "content": instructions}] if instructions else []) + messages
