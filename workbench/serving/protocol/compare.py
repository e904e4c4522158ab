"""`POST /v1/compare` request model (a workbench extension: neither OpenAI nor vLLM define it).

One text after one prompt, teacher-forced through several variants of the served model: the
base, a served LoRA adapter (`model`), interventions (`interventions`, the completions
extension's objects), or an adapter with interventions. Unknown fields are refused (400
naming them), as this route is ours alone.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workbench.errors import ValidationError
from workbench.serving.protocol.chat import ChatMessageParam

MAX_VARIANTS = 16


class CompareVariant(BaseModel):
    """One variant: a served model name (the base or an adapter) and interventions."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None  # its column in the table; default: the model name (+ interventions)
    model: str | None = None  # None: the request's model
    interventions: list[dict[str, Any]] | None = None


class CompareRequest(BaseModel):
    """`prompt` (the context) and `text` (the scored tokens), or `messages` (the last, the
    assistant's turn, scored after the others through the chat template); `variants` (at
    least two, the `reference` one compared against the others)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | None = None
    text: str | None = None
    messages: list[ChatMessageParam] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    variants: list[CompareVariant] = Field(min_length=2, max_length=MAX_VARIANTS)
    reference: int = 0
    request_id: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> "CompareRequest":
        if self.messages is None and (self.prompt is None or self.text is None):
            raise ValidationError("A comparison takes `prompt` and `text`, or `messages` (the "
                                  "last, the assistant's, is compared).", parameter="text")
        if self.messages is not None and (self.prompt is not None or self.text is not None):
            raise ValidationError("A comparison takes `prompt` and `text`, or `messages`, not "
                                  "both.", parameter="messages")
        return self
