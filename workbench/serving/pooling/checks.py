"""Pooling inputs -> engine prompts, with the reference's rules and messages, and the fields
pooling requests parse but this server cannot honour (refused by name, never dropped).

Rules (reference §6 and its `_validate_input`): a pooling input may use the whole context
(`<= max_model_len`; nothing is generated); a longer one is refused with the message naming the
operation ("embedding generation", "classification", "score") and the token count;
`truncate_prompt_tokens` keeps N tokens (-1: `max_model_len`), and N > `max_model_len` is
refused with the pooling wording.
"""

from __future__ import annotations

from typing import Any

from workbench.errors import ValidationError, refuse
from workbench.serving.prompts import EnginePrompt, PromptTokenizer

TRUNCATE_TOO_LARGE = ("truncate_prompt_tokens value is greater than max_model_len. Please "
                      "request a smaller truncation size.")
_NOT_YET = "is not supported by this server yet"


def context_length_message(max_model_len: int, num_tokens: int, operation: str) -> str:
    return (f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_tokens} tokens in the input for {operation}. Please reduce the "
            "length of the input.")


class PoolingPrompts:
    """Tokenizes pooling inputs for one model and names `operation` in length refusals."""

    def __init__(self, prompts: PromptTokenizer, operation: str):
        self.prompts = prompts
        self.operation = operation
        self.max_model_len = prompts.max_model_len

    def keep(self, truncate: int | None) -> int | None:
        if truncate is None:
            return None
        if truncate > self.max_model_len:
            raise ValidationError(TRUNCATE_TOO_LARGE, parameter="truncate_prompt_tokens",
                                  value=truncate)
        return self.max_model_len if truncate == -1 else truncate

    def check(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ValueError("The decoder prompt cannot be empty")
        if len(token_ids) > self.max_model_len:
            raise ValidationError(
                context_length_message(self.max_model_len, len(token_ids), self.operation),
                parameter="input_tokens", value=len(token_ids))

    def from_text(self, text: str, *, add_special_tokens: bool = True,
                  truncate: int | None = None, side: str | None = None) -> EnginePrompt:
        keep = self.keep(truncate)
        ids = list(self.prompts.tokenizer(text, add_special_tokens=add_special_tokens).input_ids)
        ids = self.prompts.truncate(ids, keep, side)
        self.check(ids)
        return EnginePrompt(token_ids=ids, text=text)

    def from_token_ids(self, token_ids: list[int], *, truncate: int | None = None,
                       side: str | None = None) -> EnginePrompt:
        keep = self.keep(truncate)
        for token_id in token_ids:
            if not 0 <= token_id < self.prompts.vocab_size:
                raise ValidationError(f"Token id {token_id} is out of vocabulary",
                                      parameter="input", value=token_id)
        ids = self.prompts.truncate(list(token_ids), keep, side)
        self.check(ids)
        return EnginePrompt(token_ids=ids)

    def from_input(self, value: Any, *, add_special_tokens: bool = True,
                   truncate: int | None = None, side: str | None = None) -> list[EnginePrompt]:
        """`input`: a string, token ids, or a list of either (one prompt each)."""
        if isinstance(value, str):
            return [self.from_text(value, add_special_tokens=add_special_tokens,
                                   truncate=truncate, side=side)]
        if value and all(isinstance(v, int) for v in value):
            return [self.from_token_ids(value, truncate=truncate, side=side)]
        if not value:
            raise ValidationError("Input cannot be empty: give at least one text or list of "
                                  "token ids.", parameter="input")
        return [self.from_text(v, add_special_tokens=add_special_tokens, truncate=truncate,
                               side=side) if isinstance(v, str)
                else self.from_token_ids(v, truncate=truncate, side=side) for v in value]

    def from_chat(self, renderer: Any, request: Any) -> list[EnginePrompt]:
        """Chat `messages` through the model's template (no generation prompt by default): one
        prompt for a conversation, one per conversation for a batch."""
        messages = request.messages
        batch = messages if messages and isinstance(messages[0], list) else [messages]
        return [self.from_text(renderer.render(
                    conversation, add_generation_prompt=request.add_generation_prompt,
                    continue_final_message=request.continue_final_message,
                    chat_template=request.chat_template,
                    chat_template_kwargs=request.chat_template_kwargs).prompt,
                    add_special_tokens=request.add_special_tokens,
                    truncate=request.truncate_prompt_tokens, side=request.truncation_side)
                for conversation in batch]


def check_common(request: Any) -> None:
    """Refusals every pooling request shares."""
    if request.cache_salt is not None:
        refuse(f"`cache_salt` {_NOT_YET} for pooling requests.", "cache_salt")
    if request.padding == "max_length":  # "do_not_pad" is what every prompt gets here
        refuse("padding='max_length' is not supported: prompts are pooled unpadded "
                "('do_not_pad'); the served models are trained with an attention mask.",
                "padding", request.padding)
    for name in ("mm_processor_kwargs", "media_io_kwargs"):
        if getattr(request, name, None):
            refuse(f"`{name}` is not supported: the served model is text-only.", name)


def check_encoding(request: Any) -> None:
    """Output encodings: float and base64 (any `embed_dtype` and endianness); the binary
    `bytes` / `bytes_only` responses are not built."""
    if request.encoding_format in ("bytes", "bytes_only"):
        refuse(f"encoding_format '{request.encoding_format}' {_NOT_YET}; use 'float' or "
                "'base64'.", "encoding_format", request.encoding_format)


def check_score_extras(request: Any) -> None:
    """`/score` and `/rerank` extras that need a cross-encoder template."""
    if request.chat_template_kwargs is not None:
        refuse(f"`chat_template_kwargs` {_NOT_YET} for scoring (it needs a score template); "
                "`instruction` sets the judgement prompt's instruction.", "chat_template_kwargs")
