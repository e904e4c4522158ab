"""Tool parsers on real-looking outputs of each format, whole and streamed."""

from __future__ import annotations

import json

import pytest

from tests.serving.tool_parser_samples import SAMPLES, TIME, WEATHER
from workbench.serving.protocol.chat import ChatCompletionRequest
from workbench.serving.tool_parsers import TOOL_PARSERS, get_tool_parser
from workbench.serving.tool_parsers.json_scan import normalize_json

REQUEST = ChatCompletionRequest(messages=[{"role": "user", "content": "weather?"}],
                                tools=[WEATHER, TIME], tool_choice="auto")


def stream(name: str, text: str, cuts: list[int]):
    """Feeds `text` cut at `cuts` to a fresh parser; returns (content, [(name, args)], deltas)."""
    parser = get_tool_parser(name)()
    content, calls, deltas = "", {}, []
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(text))), len(text)]
    for a, b in zip(bounds, bounds[1:]):
        deltas.append(parser.extract_tool_calls_streaming(text[:a], text[:b], text[a:b],
                                                          request=REQUEST))
    deltas.append(parser.finish_streaming(text, REQUEST))
    for delta in filter(None, deltas):
        content += delta.content or ""
        for call in delta.tool_calls:
            if call.id is not None:
                assert call.index == len(calls) and call.type == "function"
                assert call.function.name and call.function.arguments == ""
                calls[call.index] = [call.function.name, ""]
            else:
                assert call.function.name is None
                calls[call.index][1] += call.function.arguments
    return content, [tuple(c) for c in calls.values()], deltas


@pytest.mark.parametrize("name,text,content,calls", SAMPLES)
def test_whole_output(name, text, content, calls):
    info = get_tool_parser(name)().extract_tool_calls(text, REQUEST)
    assert info.tools_called == bool(calls)
    assert info.content == (content if calls else text)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in info.tool_calls] == calls
    for call in info.tool_calls:
        assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
        # json.dumps's separators; numbers and escapes as the model wrote them
        assert normalize_json(call.function.arguments) == call.function.arguments
        assert isinstance(json.loads(call.function.arguments), dict)


@pytest.mark.parametrize("name,text,content,calls", SAMPLES)
def test_streamed_one_character_at_a_time(name, text, content, calls):
    whole = get_tool_parser(name)().extract_tool_calls(text, REQUEST)
    got_content, got_calls, _ = stream(name, text, list(range(len(text))))
    assert got_content == (whole.content or "")
    assert got_calls == [(c.function.name, c.function.arguments) for c in whole.tool_calls]


def test_name_delta_comes_before_any_argument():
    _, _, deltas = stream("hermes", SAMPLES[0][1], list(range(len(SAMPLES[0][1]))))
    tool_deltas = [c for d in deltas if d for c in d.tool_calls]
    assert tool_deltas[0].id and tool_deltas[0].function.name == "get_weather"
    assert all(c.id is None and c.function.arguments for c in tool_deltas[1:])
    assert len({c.index for c in tool_deltas}) == 1


def test_nothing_sent_for_a_partial_tag_until_it_is_decided():
    parser = get_tool_parser("hermes")()
    assert parser.extract_tool_calls_streaming("", "Hi <tool", "Hi <tool").content == "Hi "
    assert parser.extract_tool_calls_streaming("Hi <tool", "Hi <tool_c", "_c") is None
    assert parser.finish_streaming("Hi <tool_c").content == "<tool_c"


def test_a_truncated_call_is_content_when_whole():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": '
    info = get_tool_parser("hermes")().extract_tool_calls(text, REQUEST)
    assert not info.tools_called and info.content == text


def test_pythonic_never_evaluates_code():
    text = '[get_weather(city=__import__("os").getcwd())]'
    info = get_tool_parser("pythonic")().extract_tool_calls(text, REQUEST)
    assert not info.tools_called and info.content == text


def test_qwen3_xml_values_follow_the_schema_types():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n"
            "<parameter=days>\n42\n</parameter>\n</function>\n</tool_call>")
    info = get_tool_parser("qwen3_xml")().extract_tool_calls(text, REQUEST)
    assert json.loads(info.tool_calls[0].function.arguments) == {"city": "42", "days": 42}


def test_unknown_parser_lists_the_valid_names():
    with pytest.raises(KeyError, match="invalid tool call parser: nope \\(chose from .*hermes"):
        get_tool_parser("nope")


def test_the_reference_names_are_registered():
    assert {"hermes", "llama3_json", "mistral", "pythonic", "qwen3_xml"} <= set(TOOL_PARSERS)


def test_parsers_with_special_markers_keep_special_tokens():
    request = REQUEST.model_copy()
    get_tool_parser("hermes")().adjust_request(request)
    assert request.skip_special_tokens is False
    request = REQUEST.model_copy()
    get_tool_parser("pythonic")().adjust_request(request)
    assert request.skip_special_tokens is True


@pytest.mark.parametrize("module", ["workbench.serving.tool_parsers",
                                    "workbench.serving.tool_parsers.abstract",
                                    "workbench.serving.tool_parsers.json_scan"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0
