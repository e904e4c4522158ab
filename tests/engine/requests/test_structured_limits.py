"""Grammar memory is bounded, and a grammar that cannot match never reports `stop`."""

from __future__ import annotations

import pytest

from workbench.engine.requests.structured import GrammarCompiler
from workbench.errors import ValidationError
from workbench.sampling_params import SamplingParams, StructuredOutputsParams


@pytest.fixture(scope="module")
def tokenizer(tiny_llama):
    return tiny_llama.tokenizer


def _compiler(tokenizer, **limits) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id], **limits)


def test_a_grammar_over_the_size_limit_is_refused_naming_structured_outputs(tokenizer):
    compiler = _compiler(tokenizer, max_grammar_bytes=1 << 20)
    compiler.compile(StructuredOutputsParams(regex="[a-z]+"))  # small: fine
    with pytest.raises(ValidationError) as info:
        compiler.compile(StructuredOutputsParams(regex="(x{100}){100}"))  # ~5 MiB of lexer
    assert info.value.parameter == "structured_outputs"
    assert "structured_outputs.regex compiles to" in str(info.value)
    assert len(compiler._cache) == 1  # the refused one is not kept


def test_the_grammar_cache_is_bounded_by_bytes(tokenizer):
    compiler = _compiler(tokenizer, cache_bytes=8 << 20)
    for i in range(4):  # each ~5 MiB: at most one fits the budget
        compiler.compile(StructuredOutputsParams(regex=f"(y{{{100 + i}}}){{100}}"))
    assert compiler.num_compiled == 4
    assert len(compiler._cache) < 4 and compiler.cached_bytes <= 8 << 20  # unbounded: all 4


def test_a_grammar_with_no_finite_match_finishes_with_length(tiny_llama):
    from workbench import LLM

    llm = LLM(tiny_llama, max_model_len=128, seed=0)
    params = SamplingParams(max_tokens=20, temperature=0, structured_outputs=(
        StructuredOutputsParams(grammar='start: "a" start')))
    out = llm.generate(["Hi"], params)[0].outputs[0]
    assert out.finish_reason == "length"
    assert out.text and set(out.text) == {"a"}
