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


CUT_NAMED = '{"city": "Ro'
CUT_REQUIRED = '[{"name": "f", "parameters": {"city": "Ro'


def test_a_named_call_cut_off_is_still_the_call_with_empty_content():
    """vLLM: the named tool's arguments are the output, partial or not; content is ""."""
    from workbench.serving.tool_parsers.constrained import NamedToolParser

    info = NamedToolParser(function_name="f").extract_tool_calls(CUT_NAMED)
    assert info.tools_called and info.content == ""
    assert info.tool_calls[0].function.name == "f"
    streamed = NamedToolParser(function_name="f")
    deltas = [streamed.extract_tool_calls_streaming("", CUT_NAMED[:i], "")
              for i in range(1, len(CUT_NAMED))] + [streamed.finish_streaming(CUT_NAMED)]
    arguments = "".join(c.function.arguments or "" for d in deltas if d for c in d.tool_calls)
    assert info.tool_calls[0].function.arguments == arguments  # what the stream sent


def test_a_required_call_list_cut_off_gives_no_calls_and_no_json_as_content():
    from workbench.serving.tool_parsers.constrained import RequiredToolParser

    info = RequiredToolParser().extract_tool_calls(CUT_REQUIRED)
    assert not info.tools_called and info.content == ""
    whole = RequiredToolParser().extract_tool_calls('[{"name": "f", "parameters": {}}]')
    assert whole.tools_called and whole.content == ""
