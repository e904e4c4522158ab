"""`thinking_token_budget`: the reasoning is ended by force once it has used its budget."""

from __future__ import annotations

import pytest

from tests.engine.helpers import make_llm
from workbench.engine.requests.thinking import ThinkingBudget
from workbench.errors import ValidationError
from workbench.sampling_params import SamplingParams

END = [7, 8, 9]  # a three-token end tag, as `</`, `think`, `>` in SmolLM2's vocabulary


def drive(budget: ThinkingBudget, model_tokens: list[int]) -> list[int]:
    """The output when the model would say `model_tokens`, forced tokens taking precedence."""
    out: list[int] = []
    for token in model_tokens:
        forced = budget.forced_token(out)
        out.append(token if forced is None else forced)
        budget.observe(out)
    return out


def test_an_open_reasoning_is_closed_after_its_budget():
    assert drive(ThinkingBudget(3, END, None), [1, 2, 3, 4, 5, 6, 1, 2]) == [1, 2, 3, 7, 8, 9, 1, 2]
    assert drive(ThinkingBudget(0, END, None), [1, 2, 3, 4]) == [7, 8, 9, 4]


def test_a_reasoning_closed_in_time_is_left_alone():
    assert drive(ThinkingBudget(4, END, None), [1, 7, 8, 9, 2, 3, 4, 5]) == [1, 7, 8, 9, 2, 3, 4, 5]


def test_a_begun_end_tag_is_completed_not_restarted():
    assert drive(ThinkingBudget(2, END, None), [1, 7, 5, 5, 5]) == [1, 7, 8, 9, 5]


def test_with_a_start_tag_counting_begins_after_it():
    budget = ThinkingBudget(2, END, [3])
    assert drive(budget, [1, 2, 3, 4, 5, 6, 6, 6, 6]) == [1, 2, 3, 4, 5, 7, 8, 9, 6]


def test_the_engine_forces_the_end_tag(tiny_llama):
    llm = make_llm(tiny_llama)
    ids = tiny_llama.tokenizer("Think about it")["input_ids"]
    free = llm.generate([{"prompt_token_ids": ids}],
                        SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    free_ids = list(free[0].outputs[0].token_ids)
    end = [t for t in (11, 12) if t not in free_ids[:6]]  # ids the model would not pick itself
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=1,
                            thinking_token_budget=4, reasoning_end_token_ids=end)
    out = llm.generate([{"prompt_token_ids": ids}], params)[0].outputs[0]
    assert list(out.token_ids[:4]) == free_ids[:4]
    assert list(out.token_ids[4:4 + len(end)]) == end
    assert out.logprobs[4][end[0]].logprob < 0  # the model's own (raw) logprob of the forced id


def test_budget_parameters_are_checked():
    with pytest.raises(ValidationError, match="thinking_token_budget must be -1"):
        SamplingParams(thinking_token_budget=-2, reasoning_end_token_ids=[1])
    with pytest.raises(ValidationError, match="needs reasoning_end_token_ids"):
        SamplingParams(thinking_token_budget=3)
    SamplingParams(thinking_token_budget=-1)  # no limit
