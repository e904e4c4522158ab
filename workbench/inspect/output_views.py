"""Concise notebook views of the offline API's objects: `LLM`, `RequestOutput`,
`CompletionOutput` and the pooling outputs.

Each function returns deterministic HTML (`workbench.inspect.html`): the text, token counts,
finish reasons and a few numbers, never timestamps or memory addresses. The classes' own
`_repr_html_` call these, so Lab shows a small card instead of a dataclass dump; their
`__repr__` stays vLLM's.
"""

from __future__ import annotations

from typing import Any

from workbench.inspect import html as h

_BOX = "font-family:var(--jp-code-font-family, monospace);font-size:12px"


def _card(title: str, body: str) -> str:
    return f'<div class="wb-output" style="{_BOX}"><b>{title}</b>{body}</div>'


def llm_summary(llm: Any) -> dict[str, Any]:
    """The facts an `LLM` card shows, as plain values."""
    engine, config = llm.llm_engine, llm.config
    loaded = engine.loaded
    return {"model": engine.served_model_name, "kind": getattr(loaded, "kind", "generate"),
            "dtype": str(getattr(loaded, "dtype", config.dtype)).removeprefix("torch."),
            "device": getattr(loaded, "device", config.device),
            "max_model_len": engine.max_model_len, "seed": config.seed}


def llm_repr(llm: Any) -> str:
    s = llm_summary(llm)
    return (f"LLM({s['model']!r}, {s['kind']}, {s['dtype']} on {s['device']}, "
            f"max_model_len={s['max_model_len']}, seed={s['seed']})")


def llm_html(llm: Any) -> str:
    s = llm_summary(llm)
    can = ("generate, chat, beam_search" if s["kind"] == "generate"
           else "embed, score, encode")
    rows = "".join(f'<tr><th style="text-align:left;padding:1px 6px">{k}</th>'
                   f'<td style="padding:1px 6px">{h.escape(s[k])}</td></tr>'
                   for k in ("kind", "dtype", "device", "max_model_len", "seed"))
    return _card(f"LLM {h.escape(s['model'])}",
                 f'<table style="border-collapse:collapse">{rows}</table>'
                 + h.caption(f"methods: {h.escape(can)}"))


def _completion_row(c: Any) -> tuple:
    return (c.index, f'<span style="white-space:pre-wrap">{h.token_text(c.text)}</span>',
            len(c.token_ids), h.escape(c.finish_reason or "running"),
            h.escape("" if c.stop_reason is None else c.stop_reason),
            h.fmt(c.cumulative_logprob))


_COMPLETION_HEADERS = ["index", "text", "tokens", "finish", "stop reason", "cumulative logprob"]


def completion_html(c: Any) -> str:
    return _card("CompletionOutput", h.table(_COMPLETION_HEADERS, [_completion_row(c)],
                                             escape_cells=False))


def request_html(out: Any) -> str:
    state = "finished" if out.finished else "running"
    prompt = h.ellipsis(out.prompt, 80) if out.prompt is not None else "(token ids)"
    head = (f" {h.escape(out.request_id)} · {state} · prompt {prompt} "
            f"({len(out.prompt_token_ids)} tokens, {out.num_cached_tokens} cached)")
    return _card("RequestOutput", h.caption(head) + h.table(
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
    return _card(type(out).__name__, h.caption(
        f"{h.escape(out.request_id)} · {h.escape(out.finish_reason)} · prompt {prompt} "
        f"({len(out.prompt_token_ids)} tokens)") + f"<div>{value}</div>")
