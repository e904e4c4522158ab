"""`/tokenize` and `/detokenize` models; `/tokenize` takes either a prompt or chat messages."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from workbench.errors import ValidationError
from workbench.serving.protocol.chat import ChatCompletionToolsParam, ChatMessageParam
from workbench.serving.protocol.common import OpenAIBaseModel


class TokenizeCompletionRequest(OpenAIBaseModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(OpenAIBaseModel):
    model: str | None = None
    messages: list[ChatMessageParam]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatCompletionToolsParam] | None = None
    return_token_strs: bool | None = False

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("continue_final_message") \
                and data.get("add_generation_prompt"):
            raise ValidationError("Cannot set both `continue_final_message` and "
                                  "`add_generation_prompt` to True.")
        return data


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str
