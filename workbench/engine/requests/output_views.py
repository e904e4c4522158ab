"""Concise notebook cards of the engine's outputs: `RequestOutput`, `CompletionOutput` and the
pooling outputs (their `_repr_html_`).

Each function returns deterministic HTML (`workbench/display/html.py`): the text, token counts, finish
reasons and a few numbers, never timestamps or memory addresses, so Lab shows a small card
instead of a dataclass dump; the classes' `__repr__` stays vLLM's.
"""

from __future__ import annotations

from typing import Any

from workbench.display import html as h

_BOX = "font-family:var(--jp-code-font-family, monospace);font-size:12px"


def card(title: str, body: str) -> str:
    """A titled box in the notebook's code font."""
    return f'<div class="wb-output" style="{_BOX}"><b>{title}</b>{body}</div>'


def _completion_row(c: Any) -> tuple:
    return (c.index, f'<span style="white-space:pre-wrap">{h.token_text(c.text)}</span>',
            len(c.token_ids), h.escape(c.finish_reason or "running"),
            h.escape("" if c.stop_reason is None else c.stop_reason),
            h.fmt(c.cumulative_logprob))


_COMPLETION_HEADERS = ["index", "text", "tokens", "finish", "stop reason", "cumulative logprob"]


def completion_html(c: Any) -> str:
    return card("CompletionOutput", h.table(_COMPLETION_HEADERS, [_completion_row(c)],
                                             escape_cells=False))


def request_html(out: Any) -> str:
    state = "finished" if out.finished else "running"
    if getattr(out, "error", None):  # the engine failed it: say why
        state = f"failed ({h.escape(out.error)})"
    prompt = h.ellipsis(out.prompt, 80) if out.prompt is not None else "(token ids)"
    head = (f" {h.escape(out.request_id)} · {state} · prompt {prompt} "
            f"({len(out.prompt_token_ids)} tokens, {out.num_cached_tokens} cached)")
    return card("RequestOutput", h.caption(head) + h.table(
        _COMPLETION_HEADERS, [_completion_row(c) for c in out.outputs], escape_cells=False))


def pooling_html(out: Any) -> str:
    """An embedding (size and first values), label probabilities or a score."""
    o = out.outputs
    if hasattr(o, "embedding"):
        head = ", ".join(h.fmt(v) for v in o.embedding[:4])
        value = f"embedding of {len(o.embedding)} floats [{head}, …]"
    elif hasattr(o, "probs"):
        value = "probs [" + ", ".join(h.fmt(v) for v in o.probs) + "]"
    elif hasattr(o, "score"):
        value = f"score {h.fmt(o.score)}"
    else:
        value = f"data of shape {tuple(o.data.shape)}"
    prompt = h.ellipsis(out.prompt, 80) if out.prompt is not None else "(token ids)"
    return card(type(out).__name__, h.caption(
        f"{h.escape(out.request_id)} · {h.escape(out.finish_reason)} · prompt {prompt} "
        f"({len(out.prompt_token_ids)} tokens)") + f"<div>{value}</div>")
