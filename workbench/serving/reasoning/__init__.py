"""Reasoning parsers: `reasoning` and `content` out of model text, under the reference's names.

`get_reasoning_parser(name)` returns the class; `cls(tokenizer)` serves one output. Built in:
`deepseek_r1` (reasoning from the first token until `</think>`, the start tag optional, as
R1's template opens it) and `qwen3` (reasoning only when the output starts with `<think>` or
the prompt left one open; otherwise all content, as with `enable_thinking=False`) and
`mistral` (the same with `[THINK]...[/THINK]`).
"""

from __future__ import annotations

from workbench.serving.reasoning.abstract import ReasoningParser, Split


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"
    reasoning_without_start = True


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"
    reasoning_without_start = False


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
