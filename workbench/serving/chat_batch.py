"""`/v1/chat/completions/batch`: N conversations in one request, one choice per conversation.

As vLLM's `OpenAIServingChatBatch`: `messages` is a list of conversations; every other field is
a chat completion's and applies to each conversation (logprobs, `logprob_token_ids`, a JSON
schema, ...). Each conversation runs as its own chat request `<id>_<i>` through the chat
pipeline, all at once; the answer is one `chat.completion` whose choice `i` is conversation
`i`'s, with the usage summed. No streaming, tools, beam search or `n > 1` (vLLM's limits).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Any

from pydantic import Field, model_validator

from workbench.errors import ValidationError
from workbench.serving.base import RequestMeta
from workbench.serving.protocol.chat import ChatCompletionRequest, ChatCompletionResponse
from workbench.serving.protocol.common import OpenAIBaseModel, UsageInfo

_REFUSED = {  # field -> vLLM's message (stream and tools: ours, vLLM has no such fields here)
    "use_beam_search": "Batch chat completions do not support beam search. Please set "
                       "`use_beam_search` to False.",
    "stream": "Batch chat completions do not support streaming. Please set `stream` to "
              "False.",
    "tools": "Batch chat completions do not support tools. Please omit `tools`.",
}


class BatchChatCompletionRequest(OpenAIBaseModel):
    """`messages`: conversations; the other fields are `ChatCompletionRequest`'s."""

    messages: Annotated[list[Annotated[list[dict[str, Any]], Field(min_length=1)]],
                        Field(min_length=1)]
    model: str | None = None
    request_id: str | None = None

    def model_post_init(self, context: Any, /) -> None:
        """The other fields are a chat request's (checked, unknown ones refused, by it)."""

    @model_validator(mode="before")
    @classmethod
    def _check_batch_mode(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, message in _REFUSED.items():
            if data.get(name):
                raise ValidationError(message, parameter=name)
        tool_choice = data.get("tool_choice")
        if tool_choice not in (None, "none"):
            raise ValidationError(_REFUSED["tools"], parameter="tool_choice")
        if data.get("logprob_token_ids") and not data.get("logprobs"):
            raise ValidationError("when using `logprob_token_ids`, `logprobs` must be set to "
                                  "true.", parameter="logprob_token_ids")
        n = data.get("n", 1)
        if n is not None and n != 1:
            raise ValidationError("Batch chat completions do not support `n > 1`. Please set "
                                  "`n` to 1.", parameter="n", value=n)
        return data

    def conversation(self, i: int, request_id: str) -> ChatCompletionRequest:
        """Conversation `i` as a single chat request (every shared field, its own id)."""
        data = {**self.model_dump(exclude={"messages", "request_id"}, exclude_unset=True),
                **(self.model_extra or {})}
        return ChatCompletionRequest.model_validate(
            {**data, "messages": self.messages[i], "request_id": request_id})


async def create_batch(chat: Any, request: BatchChatCompletionRequest, meta: RequestMeta
                       ) -> ChatCompletionResponse:
    """Every conversation through `chat` (the server's `ChatServing`) at once."""
    base = meta.header("x-request-id") or request.request_id or uuid.uuid4().hex
    headers = {k: v for k, v in meta.headers.items() if k != "x-request-id"}
    singles = [request.conversation(i, f"{base}_{i}") for i in range(len(request.messages))]
    tasks = [asyncio.ensure_future(chat.create(single, RequestMeta(headers=headers)))
             for single in singles]
    try:
        answers = await asyncio.gather(*tasks)
    except BaseException:  # one failed (or the client left): the others stop too
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    choices = []
    for i, answer in enumerate(answers):
        for choice in answer.choices:
            choices.append(choice.model_copy(update={"index": i}))
    prompt = sum(a.usage.prompt_tokens for a in answers)
    completion = sum(a.usage.completion_tokens or 0 for a in answers)
    return ChatCompletionResponse(
        id=f"chatcmpl-{base}", created=answers[0].created, model=answers[0].model,
        choices=choices, system_fingerprint=answers[0].system_fingerprint,
        usage=UsageInfo(prompt_tokens=prompt, completion_tokens=completion,
                        total_tokens=prompt + completion))
