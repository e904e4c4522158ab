"""`ParsedOutput`: tokens marked reasoning / content / tool_call by the server's own parsers."""

from __future__ import annotations

import json

import pytest

from workbench.inspect import ParsedOutput

TOKENS = ["<", "think", ">", "Need", " weather", ".", "</", "think", ">", "Sure", ".\n", "<",
          "tool", "_", "call", ">\n", '{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}',
          "\n</", "tool", "_", "call", ">"]


def test_each_token_gets_its_part():
    out = ParsedOutput.from_tokens(TOKENS, reasoning_parser="qwen3", tool_parser="hermes")
    parts = [r.part for r in out]
    assert parts == ["reasoning"] * 9 + ["content"] * 2 + ["tool_call"] * 12
    assert out.reasoning == "Need weather." and out.content == "Sure.\n"
    assert [(c["name"], json.loads(c["arguments"])) for c in out.tool_calls] == \
        [("get_weather", {"city": "Oslo"})]
    assert out.counts == {"reasoning": 9, "content": 2, "tool_call": 12}
    assert "".join(out.tokens("tool_call")).startswith("<tool_call>")
    assert out[9].start == len("".join(TOKENS[:9])) and out[-1].end == len(out.text)


def test_unfinished_reasoning_is_all_reasoning_and_no_parsers_all_content():
    out = ParsedOutput.from_tokens(["Let", " me"], reasoning_parser="deepseek_r1")
    assert [r.part for r in out] == ["reasoning", "reasoning"] and out.content is None
    plain = ParsedOutput.from_tokens(["<tool_call>", "{}"])
    assert [r.part for r in plain] == ["content", "content"] and plain.content == "<tool_call>{}"


def test_from_a_chat_body_with_logprobs():
    body = {"choices": [{"index": 0, "message": {}, "logprobs": {"content": [
        {"token": t, "logprob": -0.5, "top_logprobs": []} for t in TOKENS]}}]}
    out = ParsedOutput.from_chat(body, reasoning_parser="qwen3", tool_parser="hermes")
    assert out[0].logprob == -0.5 and len(out.tool_calls) == 1
    frame = out.to_frame()
    assert list(frame.columns) == ["position", "token", "start", "end", "part", "logprob"]
    with pytest.raises(ValueError, match="logprobs=True"):
        ParsedOutput.from_chat({"choices": [{"index": 0, "logprobs": None}]})


def test_html_is_deterministic_and_shows_the_calls():
    out = ParsedOutput.from_tokens(TOKENS, reasoning_parser="qwen3", tool_parser="hermes")
    again = ParsedOutput.from_tokens(TOKENS, reasoning_parser="qwen3", tool_parser="hermes")
    assert out._repr_html_() == again._repr_html_()
    assert "get_weather" in out._repr_html_() and "tool_call" in out._repr_html_()
    assert repr(out) == "ParsedOutput(23 tokens: 9 reasoning, 2 content, 12 tool_call; 1 tool calls)"


def test_docstring_examples_run():
    import doctest

    import workbench.inspect.parsed_output as module

    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0


def test_a_workbench_result_gives_its_parsed_output():
    from workbench.backends.result import Result

    body = {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": None},
            "logprobs": {"content": [{"token": t, "logprob": -1.0} for t in TOKENS]}}]}
    parsed = Result(body).parsed(reasoning_parser="qwen3", tool_parser="hermes")
    assert parsed.counts["tool_call"] == 12 and parsed.tool_calls[0]["name"] == "get_weather"
    assert Result({"choices": [{"index": 0, "message": {}, "logprobs": None}]}).parsed() is None


def test_html_marks_whitespace_visibly_and_the_frame_keeps_raw_text():
    out = ParsedOutput.from_tokens(TOKENS, reasoning_parser="qwen3", tool_parser="hermes")
    html = out._repr_html_()
    assert ">.⏎</span>" in html and ">␣weather</span>" in html and ">Sure</span>" in html
    assert "title=\"10 '.\\n': content" in html.replace("&#x27;", "'")  # the raw token on hover
    assert ">.\\n</span>" not in html  # not the escape sequence drawn as text
    frame = out.to_frame()
    assert list(frame["token"][:5]) == TOKENS[:5] and ".\n" in list(frame["token"])
