"""`ScorePlan` and its spans without a model: the spans of texts and turns from a hand-made
tokenizer, the request of all of them, and the tables cut from a hand-made answer."""

from __future__ import annotations

import pytest

from workbench.errors import ValidationError
from workbench.inspect.scoring import ScoredSpan
from workbench.verbs.scores import ScorePlan, conversations_of, text_spans, turn_spans


def tokens(text: str, special: bool) -> list[int]:
    """One id per character (its code), a BOS (1) first when `special`."""
    return ([1] if special else []) + [ord(c) for c in text]


def test_each_text_after_its_prompt():
    assert text_spans("ab", ["c", "de"], tokens) == [ScoredSpan([1, 97, 98, 99], 3),
                                                     ScoredSpan([1, 97, 98, 100, 101], 3)]
    assert text_spans(["a", "b"], ["c", "d"], tokens)[1] == ScoredSpan([1, 98, 100], 2)
    with pytest.raises(ValueError, match="Got 2 prompts for 1 texts."):
        text_spans(["a", "b"], "c", tokens)
    with pytest.raises(ValidationError, match="has no tokens") as info:
        text_spans("a", "", tokens)
    assert info.value.parameter == "text"


def test_each_conversation_s_last_turn_after_the_messages_before_it():
    def rendered(messages, generation_prompt):
        ids = [ord(m["content"]) for m in messages]
        return ids + [0] if generation_prompt else ids[:-1] + [0, ids[-1], 2]

    conv = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert turn_spans(conv, rendered) == [ScoredSpan([97, 0, 98, 2], 2)]
    assert conversations_of(conv) == [conv] and conversations_of([conv, conv]) == [conv, conv]
    with pytest.raises(ValidationError, match="must be the assistant's"):
        turn_spans([conv[0]], rendered)


def test_one_request_scores_every_span():
    plan = ScorePlan([ScoredSpan([1, 2, 3], 1), ScoredSpan([1, 4], 1)], logprobs=2)
    assert plan.prompts == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [1, 4]}]
    assert (plan.params.max_tokens, plan.params.prompt_logprobs, plan.params.token_stats) == (
        1, 2, True)
    assert plan.body(token_stats=False) == {"prompt": [[1, 2, 3], [1, 4]], "max_tokens": 1,
                                            "temperature": 0, "prompt_logprobs": 2}
    assert plan.body(token_stats=True)["token_stats"] is True


def test_the_tables_from_one_completions_answer():
    def entry(logprob, rank):
        return {"logprob": logprob, "rank": rank, "decoded_token": None}

    answer = {"choices": [
        {"index": 0, "text": "x", "prompt_logprobs": [
            None, {"2": entry(-1.0, 3), "9": entry(-0.5, 1)}, {"3": entry(-0.25, 1)}]},
        {"index": 1, "text": "y", "prompt_logprobs": [None, {"4": entry(-2.0, 5)}]}]}
    plan = ScorePlan([ScoredSpan([1, 2, 3], 1), ScoredSpan([1, 4], 1)])
    first, second = plan.assemble([answer, answer])
    assert [(r.position, r.token_id, r.logprob, r.rank) for r in first] == [
        (0, 2, -1.0, 3), (1, 3, -0.25, 1)]
    assert [(r.token_id, r.logprob, r.rank) for r in second] == [(4, -2.0, 5)]
    with pytest.raises(ValueError, match="not those of the scored tokens"):
        ScorePlan([ScoredSpan([1, 5], 1)]).assemble([answer])
