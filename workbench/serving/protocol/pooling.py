"""Pooling request and response models: `/v1/embeddings`, `/pooling`, `/classify`, `/score`,
`/rerank` (reference §6), fields in the reference's order.

Each text endpoint takes `input` (a string, a list of strings, token ids or lists of token ids);
embeddings, pooling and classify also take chat `messages` instead (one conversation or a batch
of them, also accepted in `input`; rendered with the model's chat template,
`add_generation_prompt` false by default). Fields the server cannot honour
(`cache_salt`, `mm_processor_kwargs`, ...) are refused by `workbench.serving.pooling.checks`,
never dropped; `normalize` was removed by the reference in favour of `use_activation` and is
refused with its message.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from workbench.errors import ValidationError
from workbench.serving.protocol.chat import ChatMessageParam
from workbench.serving.protocol.common import INT64_MAX, INT64_MIN, OpenAIBaseModel, UsageInfo

TokenId = Annotated[int, Field(ge=0)]
PoolingInput = list[TokenId] | list[list[TokenId]] | str | list[str]
EncodingFormat = Literal["float", "base64", "bytes", "bytes_only"]
EmbedDType = Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"]
Endianness = Literal["native", "big", "little"]
NORMALIZE_REMOVED = "Parameter `normalize` was removed; use `use_activation` instead."


def _refuse_normalize(data: Any) -> Any:
    if isinstance(data, dict) and "normalize" in data:
        raise ValidationError(NORMALIZE_REMOVED, parameter="normalize")
    return data


def _is_chat(value: Any) -> bool:
    """Messages (`[{role, ...}]`) or a batch of conversations (`[[{role, ...}], ...]`)."""
    if not isinstance(value, list) or not value:
        return False
    first = value[0]
    return isinstance(first, dict) or (isinstance(first, list) and bool(first)
                                       and isinstance(first[0], dict))


def _form(data: Any) -> str:
    """Which request form a body is: chat when it has `messages` or its `input` is chat
    messages (or a batch of conversations), else text `input`."""
    if isinstance(data, dict):
        return "chat" if data.get("messages") is not None or _is_chat(data.get("input")) \
            else "input"
    return "chat" if getattr(data, "messages", None) is not None else "input"


def _uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class PoolingBaseRequest(OpenAIBaseModel):
    """Fields every pooling request shares (reference `EP/pooling/base/protocol.py`)."""

    model: str | None = None
    user: str | None = None  # ignored, as by the reference
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=INT64_MAX)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    padding: Literal["max_length", "do_not_pad"] | None = None  # "max_length": refused
    request_id: str | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    mm_processor_kwargs: dict[str, Any] | None = None
    cache_salt: str | None = None
    use_activation: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        return _refuse_normalize(data)


class TextInputMixin(OpenAIBaseModel):
    input: PoolingInput
    add_special_tokens: bool = True


class ChatInputMixin(OpenAIBaseModel):
    """One conversation, or a batch of them (one prompt each); given as `messages` or, as the
    reference also takes them, as `input`."""

    messages: list[ChatMessageParam] | list[list[ChatMessageParam]]
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _check_chat(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("messages") is None and _is_chat(data.get("input")):
            data = {**data, "messages": data["input"]}
            del data["input"]
        if isinstance(data, dict) and data.get("continue_final_message") \
                and data.get("add_generation_prompt"):
            raise ValidationError("Cannot set both `continue_final_message` and "
                                  "`add_generation_prompt` to True.")
        return data


class EncodingFields(OpenAIBaseModel):
    encoding_format: EncodingFormat = "float"
    embed_dtype: EmbedDType = "float32"
    endianness: Endianness = "native"


# -- /v1/embeddings -------------------------------------------------------------------------
class EmbeddingCompletionRequest(PoolingBaseRequest, TextInputMixin, EncodingFields):
    dimensions: int | None = None


class EmbeddingChatRequest(PoolingBaseRequest, ChatInputMixin, EncodingFields):
    dimensions: int | None = None


EmbeddingRequest = Annotated[
    Annotated[EmbeddingCompletionRequest, Tag("input")] | Annotated[EmbeddingChatRequest, Tag("chat")],
    Discriminator(_form)]


class EmbeddingResponseData(OpenAIBaseModel):
    index: int
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str


class EmbeddingResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: _uid("embd"))
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[EmbeddingResponseData]
    usage: UsageInfo


# -- /pooling -------------------------------------------------------------------------------
class PoolingCompletionRequest(PoolingBaseRequest, TextInputMixin, EncodingFields):
    task: str | None = None
    dimensions: int | None = None


class PoolingChatRequest(PoolingBaseRequest, ChatInputMixin, EncodingFields):
    task: str | None = None
    dimensions: int | None = None


PoolingRequest = Annotated[
    Annotated[PoolingCompletionRequest, Tag("input")] | Annotated[PoolingChatRequest, Tag("chat")],
    Discriminator(_form)]


class PoolingResponseData(OpenAIBaseModel):
    index: int
    object: Literal["pooling"] = "pooling"
    data: list[float] | list[list[float]] | float | str


class PoolingResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: _uid("pool"))
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[PoolingResponseData]
    usage: UsageInfo


# -- /classify ------------------------------------------------------------------------------
class ClassificationCompletionRequest(PoolingBaseRequest, TextInputMixin):
    pass


class ClassificationChatRequest(PoolingBaseRequest, ChatInputMixin):
    pass


ClassificationRequest = Annotated[
    Annotated[ClassificationCompletionRequest, Tag("input")]
    | Annotated[ClassificationChatRequest, Tag("chat")], Discriminator(_form)]


class ClassificationData(OpenAIBaseModel):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: _uid("classify"))
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ClassificationData]
    usage: UsageInfo


# -- /score ---------------------------------------------------------------------------------
ScoreInput = str | list[str]
# (first, second) field names a score request may use, as the reference accepts them
SCORE_FIELD_PAIRS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"),
                     ("text_1", "text_2"))


class ScoreExtras(OpenAIBaseModel):
    # keep only the first N tokens of each query / document (0: all of them)
    max_tokens_per_query: Annotated[int, Field(ge=0)] = 0
    max_tokens_per_doc: Annotated[int, Field(ge=0)] = 0
    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class ScoreRequest(PoolingBaseRequest, ScoreExtras):
    """Pairs to score: `queries`+`documents` | `queries`+`items` | `data_1`+`data_2` |
    `text_1`+`text_2`, each a string or a list; 1:1, 1:N or N:N."""

    queries: ScoreInput | None = None
    documents: ScoreInput | None = None
    items: ScoreInput | None = None
    data_1: ScoreInput | None = None
    data_2: ScoreInput | None = None
    text_1: ScoreInput | None = None
    text_2: ScoreInput | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_pair(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        given = {n for pair in SCORE_FIELD_PAIRS for n in pair if data.get(n) is not None}
        families = [first for first in ("queries", "data_1", "text_1")
                    if given & {first, *(b for a, b in SCORE_FIELD_PAIRS if a == first)}]
        if not families:
            raise ValidationError(
                "A score request needs its two sides: `queries` and `documents` (or `items`), "
                "`data_1` and `data_2`, or `text_1` and `text_2`.", parameter="queries")
        if len(families) > 1:
            raise ValidationError(f"Give one pair of fields: `{families[0]}` and "
                                  f"`{families[1]}` pairs were both set.", parameter=families[1])
        if {"documents", "items"} <= given:
            raise ValidationError("Give either `documents` or `items`, not both.",
                                  parameter="items")
        first = families[0]
        seconds = [b for a, b in SCORE_FIELD_PAIRS if a == first]
        second = next((b for b in seconds if b in given), seconds[0])
        for name in (first, second):
            if name not in given:
                raise ValidationError(f"`{name}` is required with `{first}`/`{second}`.",
                                      parameter=name)
        return data

    def sides(self) -> tuple[str, list[str], str, list[str]]:
        """(first name, first texts, second name, second texts), each side as a list."""
        for first, second in SCORE_FIELD_PAIRS:
            one, two = getattr(self, first), getattr(self, second)
            if one is not None and two is not None:
                return (first, [one] if isinstance(one, str) else list(one),
                        second, [two] if isinstance(two, str) else list(two))
        raise ValueError("At least one text element must be given")


class ScoreResponseData(OpenAIBaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: _uid("score"))
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    data: list[ScoreResponseData]
    usage: UsageInfo


# -- /rerank, /v1/rerank, /v2/rerank ----------------------------------------------------------
class RerankRequest(PoolingBaseRequest, ScoreExtras):
    query: str
    documents: list[str]
    top_n: Annotated[int, Field(ge=0)] = 0  # 0: every document
    # Cohere's field; the reference always echoes documents (its default here too)
    return_documents: bool = True


class RerankDocument(OpenAIBaseModel):
    text: str | None = None
    multi_modal: Any | None = None


class RerankResult(OpenAIBaseModel):
    index: int
    document: RerankDocument | None = None
    relevance_score: float


class RerankUsage(OpenAIBaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: _uid("rerank"))
    model: str
    usage: RerankUsage
    results: list[RerankResult]
