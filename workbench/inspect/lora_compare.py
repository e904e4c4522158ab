"""`compare_lora`: one greedy request on the base model and on an adapter, side by side.

`Workbench.compare_lora(prompt, adapter)` (or `messages=[...]` for chat) sends the same body
twice through the serving pipeline — `model` = the base model, then the adapter — with greedy
decoding and top-k logprobs, and returns a `LoRAComparison`: both `Result`s, both texts, and
`diff`, a `LogprobDiff` of their `LogprobTable`s (where they part, what the base model thought
of the adapter's token there). `adapter` is a served adapter's name, or (in the kernel) a
`LoRARequest`, which is served under its name first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.display import html as h
from workbench.lora.request import LoRARequest


@dataclass
class LoRAComparison:
    """Base vs adapter on one request."""

    base_model: str
    adapter: str
    base: Any  # workbench.backends.result.Result
    lora: Any

    @property
    def texts(self) -> tuple[str | None, str | None]:
        return self.base.text, self.lora.text

    @property
    def diff(self):
        """`LogprobDiff` base vs adapter (None when either side failed)."""
        a, b = self.base.logprobs, self.lora.logprobs
        if a is None or b is None:
            return None
        return a.diff(b, (self.base_model, self.adapter))

    def __repr__(self) -> str:
        return (f"LoRAComparison({self.base_model}: {self.base.text!r} | {self.adapter}: "
                f"{self.lora.text!r})")

    def _repr_html_(self) -> str:
        cells = []
        for name, result in ((self.base_model, self.base), (self.adapter, self.lora)):
            body = (h.escape(result.text) if result.ok
                    else h.escape(result.error["error"]["message"]))
            cells.append(f'<div style="flex:1;border:1px solid #ddd;padding:6px">'
                         f'<div style="font-size:11px;color:{h.MUTED}">{h.escape(name)}</div>'
                         f'<div style="white-space:pre-wrap">{body}</div></div>')
        diff = self.diff
        diff_html = diff._repr_html_() if diff is not None else ""
        div_id = h.content_id("wb-lora-compare", self.base_model, self.adapter, self.texts)
        return (f'<div id="{div_id}"><div style="display:flex;gap:8px">{"".join(cells)}</div>'
                f"{diff_html}</div>")


def compare_lora(wb: Any, prompt: Any = None, adapter: str | LoRARequest | None = None, *,
                 messages: list[dict[str, Any]] | None = None, max_tokens: int = 16,
                 top_logprobs: int = 5, **body: Any) -> LoRAComparison:
    """See the module docstring; `body` adds request fields (same for both calls)."""
    if adapter is None:
        raise ValueError("compare_lora needs an adapter: a served adapter's name or a "
                         "LoRARequest.")
    if (prompt is None) == (messages is None):
        raise ValueError("compare_lora needs a prompt (completions) or messages (chat).")
    name = served_name(wb, adapter)
    base_model = wb.model
    fields = {"max_tokens": max_tokens, "temperature": 0, **body}
    if messages is not None:
        fields.update(logprobs=True, top_logprobs=top_logprobs)
        run = lambda model: wb.chat(messages, model=model, **fields)  # noqa: E731
    else:
        fields.update(logprobs=top_logprobs)
        run = lambda model: wb.completions(prompt, model=model, **fields)  # noqa: E731
    return LoRAComparison(base_model, name, run(base_model), run(name))


def served_name(wb: Any, adapter: str | LoRARequest) -> str:
    if isinstance(adapter, str):
        return adapter
    if not isinstance(adapter, LoRARequest):
        raise TypeError(f"adapter must be a name or a LoRARequest, got {type(adapter).__name__}")
    servings = getattr(wb._backend, "servings", None)
    if servings is None:
        raise ValueError("A remote server serves adapters by name: load it there first "
                         "(/v1/load_lora_adapter or --lora-modules) and pass its name.")
    served = servings.adapters.lora_requests.get(adapter.lora_name)
    if served is None:
        servings.adapters.add(adapter.lora_name, adapter.lora_path)
    elif served.lora_path != adapter.lora_path:
        raise ValueError(f"An adapter named {adapter.lora_name!r} is already served from "
                         f"{served.lora_path}.")
    return adapter.lora_name
