"""Reasoning parsers: whole outputs, streams cut anywhere, prompts that open the reasoning."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.serving.reasoning import REASONING_PARSERS, get_reasoning_parser

R1 = "<think>\nThe user wants 2+2. That is 4.\n</think>\n\nThe answer is 4."
# (parser, output, opened by prompt, reasoning, content)
CASES = [
    ("deepseek_r1", R1, False, "\nThe user wants 2+2. That is 4.\n", "\n\nThe answer is 4."),
    ("deepseek_r1", "Let me think. 4.</think>4", True, "Let me think. 4.", "4"),
    ("deepseek_r1", "Let me think. 4.</think>4", False, "Let me think. 4.", "4"),
    ("deepseek_r1", "Still thinking about </thi", False, "Still thinking about </thi", None),
    ("deepseek_r1", "<think></think>", False, "", None),
    ("qwen3", R1, False, "\nThe user wants 2+2. That is 4.\n", "\n\nThe answer is 4."),
    ("qwen3", "The answer is 4.", False, "The answer is 4.", None),  # vLLM 0.32: no tag, reasoning
    ("qwen3", "<thinking is fun", False, "<thinking is fun", None),
    ("qwen3", 'Call it.<tool_call>{"name": "f"}</tool_call>', False, "Call it.",
     '<tool_call>{"name": "f"}</tool_call>'),  # a tool call ends the reasoning
    ("qwen3", "Hm<tool_call>x</think>y", False, "Hm", "<tool_call>x</think>y"),
    ("qwen3", "Let me see</think>4", True, "Let me see", "4"),
    ("qwen3", "<think>cut off by max_tokens", False, "cut off by max_tokens", None),
    ("mistral", "[THINK]Two plus two.[/THINK]4", False, "Two plus two.", "4"),
    ("mistral", "4, no thinking [here].", False, None, "4, no thinking [here]."),
]


def parser_for(name, opened):
    parser = get_reasoning_parser(name)()
    if opened:
        parser.adjust_initial_state_from_prompt("<|im_start|>assistant\n<think>\n")
    return parser


def stream(name, text, opened, cuts):
    return stream_with(parser_for(name, opened), text, cuts)


def stream_with(parser, text, cuts):
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(text))), len(text)]
    deltas = [parser.extract_reasoning_streaming(text[:a], text[:b], text[a:b])
              for a, b in zip(bounds, bounds[1:])] + [parser.finish_streaming(text)]
    reasoning = "".join(d.reasoning or "" for d in deltas if d)
    content = "".join(d.content or "" for d in deltas if d)
    return reasoning, content


@pytest.mark.parametrize("name,text,opened,reasoning,content", CASES)
def test_whole_output(name, text, opened, reasoning, content):
    assert parser_for(name, opened).extract_reasoning(text) == (reasoning, content)


@pytest.mark.parametrize("name,text,opened,reasoning,content", CASES)
def test_every_single_cut_and_every_character(name, text, opened, reasoning, content):
    for cuts in [[c] for c in range(len(text) + 1)] + [list(range(len(text)))]:
        assert stream(name, text, opened, cuts) == (reasoning or "", content or ""), cuts


@settings(max_examples=200, deadline=None)
@given(case=st.sampled_from(CASES), data=st.data())
def test_random_chunkings(case, data):
    name, text, opened, reasoning, content = case
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=len(text)))
    assert stream(name, text, opened, cuts) == (reasoning or "", content or "")


def test_a_closed_think_block_in_the_prompt_does_not_open_reasoning():
    parser = get_reasoning_parser("qwen3")()
    parser.adjust_initial_state_from_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert parser.extract_reasoning("Hello") == (None, "Hello")


@pytest.mark.parametrize("text", [R1, "The answer is 4.", "<tool_call>{}</tool_call>"])
def test_qwen3_without_thinking_is_all_content(text):
    parser = get_reasoning_parser("qwen3")(None, {"enable_thinking": False})
    assert not parser.reasons_from_start
    assert parser.extract_reasoning(text) == (None, text)
    assert stream_with(parser, text, [3, 7]) == ("", text)


def test_enable_thinking_is_qwen3s_switch_only():
    assert get_reasoning_parser("qwen3")(None, {"enable_thinking": True}).reasons_from_start
    assert get_reasoning_parser("deepseek_r1")(None, {"enable_thinking": False}).reasons_from_start


def test_end_token_ids_and_reasoning_end(tokenizer):
    parser = get_reasoning_parser("deepseek_r1")(tokenizer)
    ids = tokenizer.encode(R1, add_special_tokens=False)
    assert parser.end_token_ids == tokenizer.encode("</think>", add_special_tokens=False)
    assert parser.is_reasoning_end(ids)
    assert not parser.is_reasoning_end(tokenizer.encode("<think>\nhmm", add_special_tokens=False))


def test_reasoning_tokens_counted_up_to_the_end_tag(tokenizer):
    parser = get_reasoning_parser("deepseek_r1")(tokenizer)
    ids = tokenizer.encode(R1, add_special_tokens=False)
    count = parser.count_reasoning_tokens(ids, R1)
    assert tokenizer.decode(ids[:count]).endswith("</think>")
    assert not tokenizer.decode(ids[:count - 1]).endswith("</think>")
    assert parser.count_reasoning_tokens(ids[:5], tokenizer.decode(ids[:5])) == 5  # unfinished
    assert get_reasoning_parser("qwen3")(tokenizer).count_reasoning_tokens([1, 2], "Hi") == 2
    no_thinking = get_reasoning_parser("qwen3")(tokenizer, {"enable_thinking": False})
    assert no_thinking.count_reasoning_tokens([1, 2], "Hi") == 0


def test_unknown_parser_lists_the_valid_names():
    with pytest.raises(KeyError, match="invalid reasoning parser: nope \\(chose from .*qwen3"):
        get_reasoning_parser("nope")
    assert {"deepseek_r1", "qwen3"} <= set(REASONING_PARSERS)


def test_docstring_examples_run():
    import doctest

    import workbench.serving.reasoning as package
    import workbench.serving.reasoning.abstract as module

    for m in (package, module):
        result = doctest.testmod(m)
        assert result.failed == 0 and result.attempted > 0
