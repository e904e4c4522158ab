"""Prompts given as embeddings: the embedding table's own rows reproduce the token prompt exactly.

`{"prompt_embeds": tensor}` runs the rows through the decoder layers in place of the table
lookup; decoding then continues with ordinary tokens. With the table's rows of a prompt's own
tokens, greedy output must be token-for-token that of the token prompt (fp32), alone, batched
with token requests, chunked, and after preemption. Their blocks never enter the prefix cache.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.helpers import greedy, ids_of, make_llm
from workbench.errors import ValidationError
from workbench.sampling_params import BeamSearchParams, SamplingParams

PROMPTS = ["Once upon a time", "The weather today is", "Hello, my name is", "1 2 3 4"]


def table_rows(loaded, ids: list[int]) -> torch.Tensor:
    """The model's input embeddings of `ids`: [len(ids), hidden]."""
    with torch.inference_mode():
        return loaded.model.get_input_embeddings()(torch.tensor(ids)).clone()


def tokens_of(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_own_embeddings_give_the_token_prompt_greedy_output(tiny_llama):
    llm = make_llm(tiny_llama)
    ids = ids_of(tiny_llama, PROMPTS[0])
    want = llm.generate(ids, greedy(12, ignore_eos=True))[0]
    got = llm.generate({"prompt_embeds": table_rows(tiny_llama, ids)},
                       greedy(12, ignore_eos=True))[0]
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    assert got.outputs[0].text == want.outputs[0].text
    assert got.prompt_token_ids is None  # no ids exist for an embedded prompt


def test_embeddings_batched_with_token_requests_in_the_same_steps(tiny_llama):
    params = greedy(10, ignore_eos=True)
    ids = [ids_of(tiny_llama, p) for p in PROMPTS]
    want = tokens_of(make_llm(tiny_llama).generate(ids, params))
    mixed = [{"prompt_embeds": table_rows(tiny_llama, x)} if i % 2 else x
             for i, x in enumerate(ids)]
    assert tokens_of(make_llm(tiny_llama).generate(mixed, params)) == want


def test_a_leading_batch_dimension_of_one_is_accepted(tiny_llama):
    ids = ids_of(tiny_llama, PROMPTS[1])
    llm = make_llm(tiny_llama)
    want = tokens_of(llm.generate(ids, greedy(6, ignore_eos=True)))
    rows = table_rows(tiny_llama, ids).unsqueeze(0)  # [1, T, H]
    assert tokens_of(llm.generate({"prompt_embeds": rows}, greedy(6, ignore_eos=True))) == want


def test_chunked_prefill_splits_the_embedded_prompt(tiny_llama):
    ids = list(range(1000, 1040))
    want = tokens_of(make_llm(tiny_llama).generate(ids, greedy(8, ignore_eos=True)))
    llm = make_llm(tiny_llama, max_num_batched_tokens=7)  # 40 rows over 6 steps
    got = llm.generate({"prompt_embeds": table_rows(tiny_llama, ids)}, greedy(8, ignore_eos=True))
    assert tokens_of(got) == want


def test_preemption_recomputes_from_the_embeddings_kept_on_the_request(tiny_llama):
    params = greedy(30, ignore_eos=True)
    ids = [ids_of(tiny_llama, p) for p in PROMPTS]
    want = tokens_of(make_llm(tiny_llama, max_model_len=64, block_size=4,
                              num_kv_blocks=256).generate(ids, params))
    llm = make_llm(tiny_llama, max_model_len=64, block_size=4, num_kv_blocks=16)
    got = llm.generate([{"prompt_embeds": table_rows(tiny_llama, x)} for x in ids], params)
    assert llm.llm_engine.stats().num_preemptions > 0
    assert tokens_of(got) == want


def test_n_samples_share_the_embedded_prompt(tiny_llama):
    ids = ids_of(tiny_llama, PROMPTS[2])
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    want = make_llm(tiny_llama).generate(ids, params)[0]
    got = make_llm(tiny_llama).generate({"prompt_embeds": table_rows(tiny_llama, ids)}, params)[0]
    assert [c.token_ids for c in got.outputs] == [c.token_ids for c in want.outputs]


def test_generated_logprobs_match_the_token_prompt(tiny_llama):
    ids = ids_of(tiny_llama, PROMPTS[3])
    llm = make_llm(tiny_llama)
    want = llm.generate(ids, greedy(5, logprobs=3))[0].outputs[0]
    got = llm.generate({"prompt_embeds": table_rows(tiny_llama, ids)},
                       greedy(5, logprobs=3))[0].outputs[0]
    assert [{t: lp.logprob for t, lp in pos.items()} for pos in got.logprobs] == \
        [{t: lp.logprob for t, lp in pos.items()} for pos in want.logprobs]


def test_embedded_prompts_never_enter_the_prefix_cache(tiny_llama):
    llm = make_llm(tiny_llama, block_size=4)
    engine = llm.llm_engine
    rows = table_rows(tiny_llama, list(range(1000, 1020)))
    for _ in range(2):
        llm.generate({"prompt_embeds": rows}, greedy(3, ignore_eos=True))
    stats = engine.stats()
    assert stats.prefix_cache_hits == 0
    assert not engine.block_manager._cached  # nothing registered either
    # while the same prompt as token ids is found the second time
    for _ in range(2):
        out = llm.generate(list(range(1000, 1020)), greedy(3, ignore_eos=True))[0]
    assert out.num_cached_tokens == 16


def test_prompt_token_count_is_the_number_of_rows(tiny_llama):
    llm = make_llm(tiny_llama)
    engine = llm.llm_engine
    req = engine.add_request("r", {"prompt_embeds": torch.zeros(7, 64)}, greedy(2))
    assert req.sequences[0].num_prompt_tokens == 7
    assert engine.stats().prompt_tokens_total == 7
    engine.abort_request("r")
    engine.step()


def test_truncate_prompt_tokens_keeps_the_last_rows(tiny_llama):
    ids = list(range(1000, 1012))
    llm = make_llm(tiny_llama)
    want = tokens_of(llm.generate(ids[-5:], greedy(4, ignore_eos=True)))
    got = llm.generate({"prompt_embeds": table_rows(tiny_llama, ids)},
                       greedy(4, ignore_eos=True, truncate_prompt_tokens=5))
    assert tokens_of(got) == want


@pytest.mark.parametrize("embeds, message", [
    (torch.zeros(3, 65), "hidden size 65"),
    (torch.zeros(2, 3, 64), "shape (num_tokens, hidden_size)"),
    (torch.zeros(64), "shape (num_tokens, hidden_size)"),
    (torch.zeros(0, 64), "cannot be empty"),
    (torch.zeros(3, 64, dtype=torch.int64), "float32, bfloat16 or float16"),
    (torch.tensor([[float("nan")] * 64]), "NaN or infinite"),
    (torch.tensor([[float("inf")] * 64]), "NaN or infinite"),
    ([[0.0] * 64], "must be a torch.Tensor"),
    (torch.zeros(300, 64), "longer than the maximum model length"),
])
def test_bad_embeddings_are_refused_by_name(tiny_llama, embeds, message):
    llm = make_llm(tiny_llama)
    with pytest.raises(ValidationError) as err:
        llm.generate({"prompt_embeds": embeds}, greedy(2))
    assert message in str(err.value)
    assert err.value.parameter == "prompt_embeds" or "maximum model length" in message
    assert not llm.llm_engine.has_unfinished_requests()


def test_prompt_logprobs_and_beam_search_are_refused(tiny_llama):
    llm = make_llm(tiny_llama)
    rows = {"prompt_embeds": torch.zeros(3, 64)}
    with pytest.raises(ValidationError, match="prompt_logprobs is not compatible"):
        llm.generate(rows, greedy(2, prompt_logprobs=1))
    with pytest.raises(ValidationError, match="not supported with prompt embeds"):
        llm.beam_search([rows], BeamSearchParams(beam_width=2, max_tokens=2))


@pytest.mark.slow
def test_smollm2_own_embeddings_match_the_token_prompt_alone_and_batched(default_model):
    llm = make_llm(default_model, max_model_len=128)
    prompts = ["The capital of France is", "def fibonacci(n):", "Water boils at"]
    ids = [ids_of(default_model, p) for p in prompts]
    params = greedy(12)
    want = tokens_of(llm.generate(ids, params))
    alone = tokens_of(llm.generate({"prompt_embeds": table_rows(default_model, ids[0])}, params))
    assert alone == want[:1]
    mixed = [ids[0], {"prompt_embeds": table_rows(default_model, ids[1])}, ids[2]]
    assert tokens_of(llm.generate(mixed, params)) == want


def test_cache_salt_in_the_prompt_dict_separates_prefix_blocks(tiny_llama):
    llm = make_llm(tiny_llama, block_size=4)
    ids = list(range(1000, 1020))

    def cached(salt):
        prompt = {"prompt_token_ids": ids, **({"cache_salt": salt} if salt else {})}
        before = llm.llm_engine.stats().prefix_cache_hits
        out = llm.generate(prompt, greedy(1))[0]
        assert llm.llm_engine.stats().prefix_cache_hits - before == out.num_cached_tokens
        return out.num_cached_tokens

    assert [cached("a"), cached("b"), cached(None), cached("a"), cached(None)] == [0, 0, 0, 16, 16]
