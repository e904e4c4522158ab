"""Pydantic models of the OpenAI-compatible API: one module per endpoint family.

`common` holds the error envelope, usage and model cards; `completion`, `chat` and `tokenize`
the request and response bodies; `checks` the raw-JSON request checks they share.
"""

from workbench.serving.protocol.chat import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    ChatMessageParam,
    DeltaMessage,
)
from workbench.serving.protocol.common import (
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    ModelPermission,
    OpenAIBaseModel,
    PromptLogprob,
    StreamOptions,
    UsageInfo,
)
from workbench.serving.protocol.completion import (
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from workbench.serving.protocol.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeRequest,
    TokenizeResponse,
)

__all__ = [
    "ChatCompletionLogProb", "ChatCompletionLogProbs", "ChatCompletionLogProbsContent",
    "ChatCompletionRequest", "ChatCompletionResponse", "ChatCompletionResponseChoice",
    "ChatCompletionResponseStreamChoice", "ChatCompletionStreamResponse", "ChatMessage",
    "ChatMessageParam", "CompletionLogProbs", "CompletionRequest", "CompletionResponse",
    "CompletionResponseChoice", "CompletionResponseStreamChoice", "CompletionStreamResponse",
    "DeltaMessage", "DetokenizeRequest", "DetokenizeResponse", "ErrorInfo", "ErrorResponse",
    "ModelCard", "ModelList", "ModelPermission", "OpenAIBaseModel", "PromptLogprob",
    "StreamOptions", "TokenizeChatRequest", "TokenizeCompletionRequest", "TokenizeRequest",
    "TokenizeResponse", "UsageInfo",
]
