"""`LLM.score_text` / `score_chat`: each scored token's logprob and rank equal transformers'
log_softmax on the tiny llama, the entropy that of its whole distribution; the chat case scores
only the assistant's turn (the template's own tokenization); batched equals one by one."""

import pytest
import torch

from tests.engine.helpers import make_llm
from workbench.errors import ValidationError

TOL = 1e-4
CONVERSATION = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": "Paris, of course."}]


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return make_llm(tiny_llama)


@torch.inference_mode()
def reference(loaded, ids: list[int]) -> torch.Tensor:
    return loaded.model(torch.tensor([ids])).logits[0].double().log_softmax(-1)


def check_against_transformers(loaded, table, ids: list[int], start: int) -> None:
    ref = reference(loaded, ids)
    assert [r.token_id for r in table] == ids[start:]
    for row, pos in zip(table, range(start, len(ids))):
        dist, token = ref[pos - 1], ids[pos]
        assert row.logprob == pytest.approx(float(dist[token]), abs=TOL)
        assert row.rank == int((dist > dist[token]).sum()) + 1
        assert row.entropy_kind == "full"
        assert row.entropy == pytest.approx(float(-(dist.exp() * dist).sum()), abs=TOL)
        assert row.part == "scored"


def test_a_completion_is_scored_token_by_token(llm, tiny_llama):
    tok = tiny_llama.tokenizer
    prompt, text = "The capital of France is", " Paris, a city on the Seine."
    table = llm.score_text(prompt, text)[0]
    context = tok(prompt)["input_ids"]
    scored = tok(text, add_special_tokens=False)["input_ids"]
    check_against_transformers(tiny_llama, table, context + scored, len(context))
    assert [r.position for r in table] == list(range(len(scored)))
    assert table.prompt == () and "".join(table.tokens) == text
    assert table.total_logprob == pytest.approx(sum(r.logprob for r in table))


def test_alternatives_are_the_top_k(llm):
    table = llm.score_text("Once upon a", " time", logprobs=3)[0]
    row = table[0]
    assert len([a for a in row.top if a.rank is not None and a.rank <= 3]) == 3
    assert row.top_mass == pytest.approx(sum(a.prob for a in row.top if a.rank <= 3), abs=1e-6)


def test_the_chat_case_scores_only_the_assistants_turn(llm, tiny_llama):
    tok = tiny_llama.tokenizer
    table = llm.score_chat(CONVERSATION)[0]
    before = tok.apply_chat_template(CONVERSATION[:-1], add_generation_prompt=True,
                                     tokenize=True, return_dict=True)["input_ids"]
    whole = tok.apply_chat_template(CONVERSATION, tokenize=True, return_dict=True)["input_ids"]
    assert whole[:len(before)] == before
    check_against_transformers(tiny_llama, table, whole, len(before))
    text = "".join(table.tokens)
    assert text.startswith("Paris, of course.") and "user" not in text
    assert text == tok.decode(whole[len(before):])  # the turn as the template ends it


def test_batched_equals_one_by_one(llm):
    prompts = ["The capital of France is", "Two plus two is", "The capital of France is"]
    texts = [" Paris.", " four, or so they say.", " Lyon."]
    batched = llm.score_text(prompts, texts, logprobs=2)
    alone = [llm.score_text(p, t, logprobs=2)[0] for p, t in zip(prompts, texts)]
    for a, b in zip(batched, alone):
        assert a.tokens == b.tokens and [r.rank for r in a] == [r.rank for r in b]
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert [r.entropy for r in a] == pytest.approx([r.entropy for r in b], abs=1e-5)
    chats = llm.score_chat([CONVERSATION, CONVERSATION[:2] + [
        {"role": "assistant", "content": "Lyon."}]])
    assert chats[0].logprobs == pytest.approx(llm.score_chat(CONVERSATION)[0].logprobs, abs=1e-5)
    assert "".join(chats[1].tokens).startswith("Lyon.")


def test_one_prompt_for_many_texts(llm):
    tables = llm.score_text("The capital of France is", [" Paris.", " Lyon."])
    assert [t.tokens[0] for t in tables] == [" Paris", " Lyon"]


@pytest.mark.parametrize("call, param", [
    (lambda llm: llm.score_text("", " Paris"), "prompt"),
    (lambda llm: llm.score_text("Hi", ""), "text"),
    (lambda llm: llm.score_chat(CONVERSATION[:2]), "messages"),
    (lambda llm: llm.score_chat([CONVERSATION[-1]]), "messages"),
])
def test_what_cannot_be_scored_is_refused_by_name(llm, call, param):
    with pytest.raises(ValidationError) as err:
        call(llm)
    assert err.value.parameter == param
