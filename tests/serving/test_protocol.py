"""Request models: vLLM's raw-JSON checks and defaults, without a model."""

from __future__ import annotations

import pydantic
import pytest

from workbench.errors import ValidationError
from workbench.serving.protocol import ChatCompletionRequest, CompletionRequest, TokenizeChatRequest

MESSAGES = [{"role": "user", "content": "Hi"}]


def refusal(model, **data) -> ValidationError:
    with pytest.raises(pydantic.ValidationError) as info:
        model.model_validate(data)
    error = info.value.errors()[0]["ctx"]["error"]
    assert isinstance(error, ValidationError)
    return error


def test_completion_max_tokens_null_means_16():
    assert CompletionRequest(prompt="x", max_tokens=None).max_tokens == 16


def test_stream_options_need_stream():
    error = refusal(CompletionRequest, prompt="x", stream_options={"include_usage": True})
    assert (error.message, error.parameter) == (
        "Stream options can only be defined when `stream=True`.", "stream_options")


def test_prompt_logprobs_not_with_stream():
    error = refusal(ChatCompletionRequest, messages=MESSAGES, stream=True, prompt_logprobs=1)
    assert error.message == "`prompt_logprobs` are not available when `stream=True`."
    assert error.parameter == "prompt_logprobs"


def test_completion_logprobs_must_be_positive_or_minus_one():
    error = refusal(CompletionRequest, prompt="x", logprobs=-2)
    assert (error.message, error.value) == ("`logprobs` must be a positive value or -1.", -2)


def test_top_logprobs_requires_logprobs():
    error = refusal(ChatCompletionRequest, messages=MESSAGES, top_logprobs=2)
    assert error.message == "when using `top_logprobs`, `logprobs` must be set to true."


def test_empty_prompt_refused():
    error = refusal(CompletionRequest, prompt="")
    assert error.message == "Either prompt or prompt_embeds must be provided and non-empty."


def test_continue_final_message_excludes_add_generation_prompt():
    error = refusal(ChatCompletionRequest, messages=MESSAGES, continue_final_message=True,
                    add_generation_prompt=True)
    assert error.parameter is None
    assert "Cannot set both `continue_final_message`" in error.message
    refusal(TokenizeChatRequest, messages=MESSAGES, continue_final_message=True,
            add_generation_prompt=True)


def test_tools_default_tool_choice_to_auto():
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert ChatCompletionRequest(messages=MESSAGES, tools=tools).tool_choice == "auto"
    assert ChatCompletionRequest(messages=MESSAGES).tool_choice == "none"


@pytest.mark.parametrize("data, message", [
    ({"tools": []}, "`tools` must not be an empty array."),
    ({"tool_choice": "auto"}, "When using `tool_choice`, `tools` must be set."),
    ({"tool_choice": "sometimes", "tools": [{"function": {"name": "f"}}]},
     "Invalid value for `tool_choice`: sometimes!"),
    ({"tool_choice": {"type": "function", "function": {"name": "g"}},
      "tools": [{"function": {"name": "f"}}]}, "does not match any of the specified `tools`"),
])
def test_tool_usage_checks(data, message):
    error = refusal(ChatCompletionRequest, messages=MESSAGES, **data)
    assert message in error.message
    assert error.parameter in ("tools", "tool_choice")


def test_reasoning_content_is_renamed():
    request = ChatCompletionRequest(messages=[
        {"role": "assistant", "content": "a", "reasoning_content": "because"}])
    assert request.messages[0].reasoning == "because"


def test_cache_salt_format():
    error = refusal(CompletionRequest, prompt="x", cache_salt="a/b")
    assert error.parameter == "cache_salt"


def test_unknown_fields_are_kept_aside():
    request = CompletionRequest(prompt="x", something_new=1)
    assert request.model_extra == {"something_new": 1}


def test_at_most_four_stop_strings():
    assert CompletionRequest(prompt="x", stop=["a", "b", "c", "d"]).stop == ["a", "b", "c", "d"]
    with pytest.raises(pydantic.ValidationError, match="at most 4"):
        ChatCompletionRequest(messages=MESSAGES, stop=["a", "b", "c", "d", "e"])
