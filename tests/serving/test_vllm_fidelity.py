"""Issue 16 item 8, read against vLLM 0.32: the tool parser's `adjust_request` runs whenever a
parser is set and tools may be called (not only for `auto`)."""

from __future__ import annotations

import pytest

from workbench.serving.chat_tools import ChatTools
from workbench.serving.config import ServerConfig
from workbench.serving.protocol.chat import ChatCompletionRequest

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("choice, kept", [
    ("auto", True), ("required", True), ({"type": "function", "function": {"name": "f"}}, True),
    ("none", False),
])
def test_hermes_keeps_special_tokens_whenever_tools_may_be_called(tokenizer, choice, kept):
    tools = ChatTools(ServerConfig(tool_call_parser="hermes", enable_auto_tool_choice=True),
                      tokenizer)
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=[TOOL],
                                    tool_choice=choice)
    tools.adjust_request(request)
    assert request.skip_special_tokens is (not kept)
