"""`prompt_distributions_from`: the engine keeps prompt tokens' full log-probabilities, the
same numbers as their prompt logprobs, whatever the prefill's chunking; `generate_together`
queues several requests at once, or none of them. On the tiny llama."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from workbench import LLM, SamplingParams
from workbench.errors import ValidationError

IDS = list(range(100, 140))  # 40 prompt tokens


def _params(start: int) -> SamplingParams:
    return SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0,
                          prompt_distributions_from=start)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, max_model_len=128, block_size=16, num_kv_blocks=64, seed=0)


def test_the_rows_are_the_prompt_logprobs_distributions(llm):
    out = llm.generate({"prompt_token_ids": IDS}, _params(25))[0]
    rows = out.prompt_distributions
    assert rows.dtype == torch.float32 and rows.shape == (15, llm.llm_engine.vocab_size)
    for i, token in enumerate(IDS[25:]):
        assert float(rows[i, token]) == out.prompt_logprobs[25 + i][token].logprob
    assert torch.allclose(rows.exp().sum(-1), torch.ones(15), atol=1e-5)
    plain = llm.generate({"prompt_token_ids": IDS}, SamplingParams(
        max_tokens=1, temperature=0, prompt_logprobs=0))[0]
    assert plain.prompt_distributions is None  # only when asked


def test_a_chunked_prefill_keeps_the_same_rows(llm, tiny_llama):
    whole = llm.generate({"prompt_token_ids": IDS}, _params(5))[0].prompt_distributions
    chunked = LLM(tiny_llama, max_model_len=128, block_size=16, num_kv_blocks=64, seed=0,
                  max_num_batched_tokens=16)  # prefill in chunks of 16 tokens
    out = chunked.generate({"prompt_token_ids": IDS}, _params(5))[0]
    assert out.metrics.num_prefill_steps == 3
    assert torch.allclose(out.prompt_distributions, whole, atol=1e-5)


def test_what_the_field_takes():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValidationError, match="prompt_distributions_from"):
            SamplingParams(prompt_logprobs=0, prompt_distributions_from=bad)
    with pytest.raises(ValidationError, match="prompt_logprobs set"):
        SamplingParams(prompt_distributions_from=1)


def test_generate_together_queues_all_or_none(llm):
    from workbench.engine.async_engine import AsyncLLMEngine

    engine = AsyncLLMEngine.from_llm(llm)
    try:
        p = _params(1)
        p.output_kind = p.output_kind.FINAL_ONLY
        outs = asyncio.run(engine.generate_together(
            [(f"t-{i}", {"prompt_token_ids": IDS[:10 + i]}, p, None) for i in range(3)]))
        assert [o.request_id for o in outs] == ["t-0", "t-1", "t-2"]
        assert [len(o.prompt_distributions) for o in outs] == [9, 10, 11]
        assert len({o.metrics.first_scheduled_time for o in outs}) == 1  # one step
        bad = [("u-0", {"prompt_token_ids": IDS[:10]}, p, None),
               ("u-1", {"prompt_token_ids": [10**9]}, p, None)]  # out of the vocabulary
        with pytest.raises(ValidationError):
            asyncio.run(engine.generate_together(bad))
        for _ in range(100):  # u-0 was aborted: the loop's next step lets it go
            if llm.llm_engine.get_num_unfinished_requests() == 0:
                break
            time.sleep(0.02)
        assert llm.llm_engine.get_num_unfinished_requests() == 0
    finally:
        engine.shutdown()


def test_the_rows_survive_preemption_in_the_middle_of_a_chunked_prefill(tiny_llama):
    from tests.engine.helpers import alone_and_preempted_mid_prefill, greedy

    params = greedy(2, prompt_logprobs=0, prompt_distributions_from=3)
    alone, preempted, preemptions = alone_and_preempted_mid_prefill(
        tiny_llama, list(range(1000, 1030)), params)
    assert preemptions > 0
    got, want = preempted.prompt_distributions, alone.prompt_distributions
    assert got.shape == want.shape == (27, tiny_llama.model.config.vocab_size)
    assert torch.allclose(got, want, atol=1e-4)
