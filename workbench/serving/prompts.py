"""Prompts -> token ids, with the reference's context-length rules and messages.

The serving layer tokenizes every prompt itself and hands the engine token ids, so the counts
it checks are the counts the engine sees. Rules (reference §2.2, §2.7):
- a prompt longer than `max_model_len` is refused (the "maximum context length" message);
- `truncate_prompt_tokens` keeps N tokens (-1: `max_model_len - 1`), from the side given by
  `truncation_side` or the tokenizer's; N > `max_model_len` is refused;
- token-id prompts must be inside the vocabulary; an empty prompt is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.errors import ValidationError


@dataclass
class EnginePrompt:
    """One prompt as the engine will see it."""

    token_ids: list[int]  # placeholders (one per row) when the prompt is `embeds`
    text: str | None = None  # None for token-id prompts until someone decodes it
    embeds: Any = None  # [tokens, hidden] tensor of a `prompt_embeds` prompt
    cache_salt: str | None = None  # the request's `cache_salt`

    def as_engine_input(self) -> dict[str, Any]:
        prompt: dict[str, Any] = ({"prompt_token_ids": self.token_ids} if self.embeds is None
                                  else {"prompt_embeds": self.embeds})
        if self.cache_salt is not None:
            prompt["cache_salt"] = self.cache_salt
        return prompt


def context_length_message(max_model_len: int, num_tokens: int) -> str:
    return (f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {num_tokens} input tokens, which exceeds this limit even without "
            "any output tokens. Please reduce the length of the input prompt.")


class PromptTokenizer:
    """Tokenizes and checks prompts against one model's vocabulary and context length."""

    def __init__(self, tokenizer: Any, max_model_len: int, vocab_size: int):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    def truncation_length(self, truncate_prompt_tokens: int | None) -> int | None:
        if truncate_prompt_tokens is None:
            return None
        if truncate_prompt_tokens > self.max_model_len:
            raise ValidationError(
                f"truncate_prompt_tokens={truncate_prompt_tokens} cannot be greater than "
                f"max_model_len = {self.max_model_len}. Please request a smaller truncation size.",
                parameter="truncate_prompt_tokens", value=truncate_prompt_tokens)
        return self.max_model_len - 1 if truncate_prompt_tokens == -1 else truncate_prompt_tokens

    def truncate(self, token_ids: list[int], keep: int | None, side: str | None) -> list[int]:
        if keep is None or keep >= len(token_ids) or keep <= 0:
            return token_ids
        side = side or getattr(self.tokenizer, "truncation_side", "left")
        return token_ids[-keep:] if side == "left" else token_ids[:keep]

    def check(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ValueError("The decoder prompt cannot be empty")
        if len(token_ids) > self.max_model_len:
            raise ValidationError(context_length_message(self.max_model_len, len(token_ids)),
                                  parameter="input_tokens", value=len(token_ids))

    def from_text(self, text: str, *, add_special_tokens: bool, truncate: int | None = None,
                  side: str | None = None) -> EnginePrompt:
        keep = self.truncation_length(truncate)
        ids = self.tokenizer(text, add_special_tokens=add_special_tokens).input_ids
        ids = self.truncate(list(ids), keep, side)
        self.check(ids)
        return EnginePrompt(token_ids=ids, text=text if keep is None else None)

    def check_token_ids(self, token_ids: list[int], parameter: str) -> None:
        """Every id inside the vocabulary, else the reference's message naming `parameter`."""
        for token_id in token_ids:
            if not 0 <= token_id < self.vocab_size:
                raise ValidationError(f"Token id {token_id} is out of vocabulary",
                                      parameter=parameter, value=token_id)

    def from_token_ids(self, token_ids: list[int], *, truncate: int | None = None,
                       side: str | None = None) -> EnginePrompt:
        keep = self.truncation_length(truncate)
        self.check_token_ids(token_ids, "prompt")
        ids = self.truncate(list(token_ids), keep, side)
        self.check(ids)
        return EnginePrompt(token_ids=ids)

    def completion_prompts(self, prompt: Any, *, add_special_tokens: bool,
                           truncate: int | None = None, side: str | None = None
                           ) -> list[EnginePrompt]:
        """`prompt` as /v1/completions takes it: text, ids, or a list of either."""
        if isinstance(prompt, str):
            return [self.from_text(prompt, add_special_tokens=add_special_tokens,
                                   truncate=truncate, side=side)]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [self.from_token_ids(prompt, truncate=truncate, side=side)]
        if not prompt:
            raise ValueError("The decoder prompt cannot be empty")
        return [self.from_text(p, add_special_tokens=add_special_tokens, truncate=truncate,
                               side=side) if isinstance(p, str)
                else self.from_token_ids(p, truncate=truncate, side=side) for p in prompt]

    def prompt_text(self, prompt: EnginePrompt) -> str:
        if prompt.text is None:
            prompt.text = self.tokenizer.decode(prompt.token_ids)
        return prompt.text
