"""Prompt tokenization and the context-length rules (reference §2.2, §2.7)."""

from __future__ import annotations

import pytest

from workbench.errors import ValidationError
from workbench.serving.prompts import PromptTokenizer, context_length_message
from workbench.serving.sampling import resolve_max_tokens


@pytest.fixture
def prompts(tokenizer):
    return PromptTokenizer(tokenizer, max_model_len=16, vocab_size=len(tokenizer))


def test_text_and_token_prompts(prompts):
    assert prompts.completion_prompts("Hello world", add_special_tokens=True)[0].token_ids == [19556, 905]
    batch = prompts.completion_prompts([[1, 2], "Hello"], add_special_tokens=True)
    assert [p.token_ids for p in batch] == [[1, 2], [19556]]


def test_prompt_longer_than_context_is_refused(prompts):
    with pytest.raises(ValidationError) as info:
        prompts.from_token_ids(list(range(3, 20)))
    assert info.value.message == context_length_message(16, 17)
    assert info.value.message.startswith("This model's maximum context length is 16 tokens. "
                                         "However, your prompt contains 17 input tokens")
    assert info.value.parameter == "input_tokens"


def test_out_of_vocabulary_ids_and_empty_prompts(prompts, tokenizer):
    with pytest.raises(ValidationError, match=f"Token id {len(tokenizer)} is out of vocabulary"):
        prompts.from_token_ids([1, len(tokenizer)])
    with pytest.raises(ValueError, match="The decoder prompt cannot be empty"):
        prompts.completion_prompts([], add_special_tokens=True)


def test_truncation(prompts):
    ids = list(range(3, 13))
    assert prompts.from_token_ids(ids, truncate=3, side="left").token_ids == [10, 11, 12]
    assert prompts.from_token_ids(ids, truncate=3, side="right").token_ids == [3, 4, 5]
    assert len(prompts.from_token_ids(list(range(3, 30)), truncate=-1).token_ids) == 15
    with pytest.raises(ValidationError, match=r"truncate_prompt_tokens=17 cannot be greater than "
                                              r"max_model_len = 16\."):
        prompts.from_token_ids(ids, truncate=17)


def test_max_tokens_clamped_to_the_context_but_never_above_it():
    assert resolve_max_tokens(10, "max_tokens", 12, 16, {}) == 4
    assert resolve_max_tokens(None, "max_tokens", 12, 16, {"max_tokens": 2}) == 2
    with pytest.raises(ValidationError) as info:
        resolve_max_tokens(17, "max_completion_tokens", 1, 16, {})
    assert info.value.message == ("max_completion_tokens=17 cannot be greater than "
                                  "max_model_len=16. Please request fewer output tokens.")
    assert info.value.parameter == "max_completion_tokens"
