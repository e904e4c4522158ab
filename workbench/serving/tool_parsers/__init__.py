"""Tool parsers: tool calls out of model text, whole or streamed, under the reference's names.

`get_tool_parser(name)` returns the class; `parser = cls(tokenizer)` serves one output
(streaming keeps state). `hermes` (`qwen3_json`), `llama3_json` (`llama4_json`), `mistral`,
`pythonic` (`llama4_pythonic`), `qwen3_xml` (`qwen3_coder`), `granite`, `jamba` and
`phi4_mini_json` are built in. `required` and named `tool_choice` do not go through these
parsers: constrained decoding makes the model write JSON, read by `constrained.py`.
"""

from __future__ import annotations

from workbench.serving.tool_parsers.abstract import Parsed, PartialCall, ToolParser
from workbench.serving.tool_parsers.hermes import HermesToolParser
from workbench.serving.tool_parsers.json_list import (
    GraniteToolParser,
    JambaToolParser,
    Phi4MiniJsonToolParser,
)
from workbench.serving.tool_parsers.llama3_json import Llama3JsonToolParser
from workbench.serving.tool_parsers.mistral import MistralToolParser
from workbench.serving.tool_parsers.pythonic import PythonicToolParser
from workbench.serving.tool_parsers.qwen3_xml import Qwen3XMLToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "qwen3_json": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama4_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "pythonic": PythonicToolParser,
    "llama4_pythonic": PythonicToolParser,
    "qwen3_xml": Qwen3XMLToolParser,
    "qwen3_coder": Qwen3XMLToolParser,
    "granite": GraniteToolParser,
    "jamba": JambaToolParser,
    "phi4_mini_json": Phi4MiniJsonToolParser,
}


def get_tool_parser(name: str) -> type[ToolParser]:
    """The parser class registered as `name`; KeyError (the reference's message) otherwise.

    >>> get_tool_parser("hermes").__name__
    'HermesToolParser'
    """
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise KeyError(f"invalid tool call parser: {name} "
                       f"(chose from {{ {', '.join(sorted(TOOL_PARSERS))} }})") from None


__all__ = ["TOOL_PARSERS", "Parsed", "PartialCall", "ToolParser", "get_tool_parser"]
