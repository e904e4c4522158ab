"""Reasoning parsers: `reasoning` and `content` out of model text, under the reference's names.

`get_reasoning_parser(name)` returns the class; `cls(tokenizer)` serves one output. Built in:
`deepseek_r1` (reasoning from the first token until `</think>`, the start tag optional, as
R1's template opens it); `qwen3` as vLLM 0.32 has it: the same, and a `<tool_call>` ends the
reasoning too, unless the request's `chat_template_kwargs` say `enable_thinking: false`, which
makes the whole output content; and `mistral` (reasoning only when the output opens it with
`[THINK]`, until `[/THINK]`).
"""

from __future__ import annotations

from workbench.serving.reasoning.abstract import ReasoningParser, Split


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"
    reasoning_without_start = True


class Qwen3ReasoningParser(ReasoningParser):
    """Qwen3 (and Qwen3-Thinking, whose template opens `<think>` itself): reasoning from the
    first token until `</think>` or a `<tool_call>`; none with `enable_thinking: false`."""

    name = "qwen3"
    reasoning_without_start = True
    implicit_end = "<tool_call>"
    thinking_switch = True


class MistralReasoningParser(ReasoningParser):
    """Magistral: `[THINK]...[/THINK]`, reasoning only when the output opens it."""

    name = "mistral"
    start_token, end_token = "[THINK]", "[/THINK]"
    reasoning_without_start = False


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
    "mistral": MistralReasoningParser,
}


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The parser class registered as `name`; KeyError (the reference's message) otherwise.

    >>> get_reasoning_parser("qwen3").__name__
    'Qwen3ReasoningParser'
    """
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise KeyError(f"invalid reasoning parser: {name} "
                       f"(chose from {{ {', '.join(sorted(REASONING_PARSERS))} }})") from None


__all__ = ["REASONING_PARSERS", "ReasoningParser", "Split", "get_reasoning_parser"]
