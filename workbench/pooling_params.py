"""How to pool one request: vLLM's `PoolingParams`, with validation.

A pooling request runs its prompt through the model and returns one vector instead of text:
- "embed": the model's pooled hidden state (mean / CLS / last token), L2-normalized by default,
  optionally cut to `dimensions` (Matryoshka models only);
- "classify": probabilities over the model's labels (`use_activation=False`: raw logits);
- "score": one relevance number (a judgement prompt on a generative model; on an embedding
  model the embedding, whose cosine with another is the score);
- "encode": the pooled hidden state as it is, not normalized unless asked.

`__post_init__` checks what the parameters alone decide; `verify(...)` resolves the defaults of
one model and refuses what that model can't do. Both raise `ValidationError` naming the
parameter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from workbench.errors import refuse

POOLING_TASKS = ("embed", "classify", "score", "encode")


@dataclass
class PoolingParams:
    """Pooling parameters for one request, as vLLM's.

    >>> PoolingParams(task="embed", normalize=False).task
    'embed'
    """

    task: str | None = None  # None: the model's default task
    dimensions: int | None = None  # Matryoshka truncation of an embedding
    normalize: bool | None = None  # embed / encode: L2-normalize (None: the task's default)
    truncate_prompt_tokens: int | None = None  # keep the last N prompt tokens; -1: max_model_len
    use_activation: bool | None = None  # classify / score: softmax (True) or raw logits

    def __post_init__(self) -> None:
        if self.task is not None and self.task not in POOLING_TASKS:
            refuse(f"Unsupported task: {self.task!r} Supported tasks: {POOLING_TASKS}",
                  "task", self.task)
        if self.dimensions is not None and (
                isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int)):
            refuse(f"dimensions must be an integer, got {self.dimensions!r}.",
                  "dimensions", self.dimensions)
        if self.truncate_prompt_tokens is not None and (
                self.truncate_prompt_tokens == 0 or self.truncate_prompt_tokens < -1):
            refuse(f"truncate_prompt_tokens must be >= 1 or -1, got {self.truncate_prompt_tokens}",
                  "truncate_prompt_tokens", self.truncate_prompt_tokens)
        for name in ("normalize", "use_activation"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                refuse(f"{name} must be a boolean, got {value!r}.", name, value)

    def clone(self) -> "PoolingParams":
        return dataclasses.replace(self)  # every field is immutable

    def verify(self, supported_tasks: tuple[str, ...], model_name: str, hidden_size: int,
               default_normalize: bool = True) -> "PoolingParams":
        """A copy with the task and its defaults resolved for one model; refuses what it can't do.

        `supported_tasks[0]` is the model's default task. Dimensions: these models are not
        Matryoshka models, so only their full size (or none) is accepted.
        """
        p = self.clone()
        p.task = p.task or supported_tasks[0]
        if p.task not in supported_tasks:
            refuse(f"Unsupported task: {p.task!r} Supported tasks: {supported_tasks}", "task", p.task)
        if p.dimensions is not None:
            if p.task != "embed":
                refuse(f"dimensions only applies to the embed task, not {p.task!r}.",
                      "dimensions", p.dimensions)
            if p.dimensions != hidden_size:
                refuse(f"Model '{model_name}' does not support Matryoshka embeddings; dimensions "
                      f"must be unset (received dimensions={p.dimensions}).",
                      "dimensions", p.dimensions)
        if p.task in ("embed", "encode"):
            if (p.normalize is not None and p.use_activation is not None
                    and p.normalize != p.use_activation):
                refuse("normalize and use_activation disagree; for embeddings use_activation is "
                      "the normalization, set only one of them.", "use_activation",
                      p.use_activation)
            chosen = p.normalize if p.normalize is not None else p.use_activation
            default = default_normalize if p.task == "embed" else False
            p.normalize = p.use_activation = default if chosen is None else chosen
        else:
            if p.normalize is not None:
                refuse(f"normalize only applies to the embed and encode tasks, not {p.task!r}; "
                      "use use_activation.", "normalize", p.normalize)
            p.use_activation = True if p.use_activation is None else p.use_activation
        return p
