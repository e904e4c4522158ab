"""The `LLM`'s notebook card and one-line repr (the engine's outputs have theirs in
`engine/requests/output_views.py`): deterministic HTML, never memory addresses."""

from __future__ import annotations

from typing import Any

from workbench.display import html as h
from workbench.engine.requests.output_views import card


def llm_summary(llm: Any) -> dict[str, Any]:
    """The facts an `LLM` card shows, as plain values."""
    engine, config = llm.llm_engine, llm.config
    loaded = engine.loaded
    arithmetic = engine.arithmetic  # dtype ("gguf": the file's blocks), gguf_activations, ...
    return {"model": engine.served_model_name, "kind": getattr(loaded, "kind", "generate"),
            "dtype": arithmetic["dtype"],
            "device": getattr(loaded, "device", config.device),
            "max_model_len": engine.max_model_len, "seed": config.seed,
            "batch_invariant": arithmetic["batch_invariant"],
            "gguf_activations": arithmetic.get("gguf_activations")}


def llm_repr(llm: Any) -> str:
    s = llm_summary(llm)
    q8 = f", gguf_activations={s['gguf_activations']!r}" if s["gguf_activations"] else ""
    return (f"LLM({s['model']!r}, {s['kind']}, {s['dtype']} on {s['device']}{q8}, "
            f"max_model_len={s['max_model_len']}, seed={s['seed']}"
            f"{', batch_invariant=True' if s['batch_invariant'] else ''})")


def llm_html(llm: Any) -> str:
    s = llm_summary(llm)
    can = ("generate, chat, beam_search" if s["kind"] == "generate"
           else "embed, score, encode")
    rows = "".join(f'<tr><th style="text-align:left;padding:1px 6px">{k}</th>'
                   f'<td style="padding:1px 6px">{h.escape(s[k])}</td></tr>'
                   for k in ("kind", "dtype", *(("gguf_activations",) if s["gguf_activations"]
                                                else ()), "device", "max_model_len", "seed",
                             *(("batch_invariant",) if s["batch_invariant"] else ())))
    return card(f"LLM {h.escape(s['model'])}",
                 f'<table style="border-collapse:collapse">{rows}</table>'
                 + h.caption(f"methods: {h.escape(can)}"))
