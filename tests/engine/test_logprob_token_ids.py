"""`logprob_token_ids`: logprobs of chosen ids at every generated position, whatever their rank."""

from __future__ import annotations

import pytest
import torch

from tests.engine.helpers import make_llm
from workbench.errors import ValidationError
from workbench.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return make_llm(tiny_llama)


def test_tracked_ids_carry_their_raw_logprobs_and_ranks(llm, tiny_llama):
    ids = tiny_llama.tokenizer("The quick brown fox")["input_ids"]
    tracked = [5, 17, 1000, 3]
    out = llm.generate([{"prompt_token_ids": ids}],
                       SamplingParams(max_tokens=3, temperature=0, logprob_token_ids=tracked))
    completion = out[0].outputs[0]
    context = list(ids)
    for token, position in zip(completion.token_ids, completion.logprobs):
        assert list(position) == [token] + [t for t in tracked if t != token]  # sampled first
        with torch.inference_mode():
            logits = tiny_llama.model(torch.tensor([context])).logits[0, -1].float()
        expected = logits.log_softmax(-1)
        for t in tracked:
            assert position[t].logprob == pytest.approx(expected[t].item(), abs=1e-4)
            assert position[t].rank == int((expected > expected[t]).sum()) + 1
        context.append(token)


def test_tracked_ids_follow_the_top_k_and_batch_with_other_rows(llm, tiny_llama):
    ids = tiny_llama.tokenizer("Hello there")["input_ids"]
    both = SamplingParams(max_tokens=2, temperature=0, logprobs=2, logprob_token_ids=[7, 8])
    plain = SamplingParams(max_tokens=2, temperature=0)
    out = llm.generate([{"prompt_token_ids": ids}] * 2, [both, plain])
    position = out[0].outputs[0].logprobs[0]
    assert list(position)[-2:] == [7, 8]  # sampled, then the top-2 (deduplicated), then 7, 8
    assert {p.rank for p in list(position.values())[:-2]} == {1, 2}
    assert out[1].outputs[0].logprobs is None
    assert out[0].outputs[0].token_ids == out[1].outputs[0].token_ids


def test_bad_logprob_token_ids_are_refused_by_name(llm):
    with pytest.raises(ValidationError, match=r"length 129, which is greater than max allowed: 128"):
        SamplingParams(logprob_token_ids=list(range(129)))
    with pytest.raises(ValidationError, match=r"in logprob_token_ids contain out-of-vocab") as err:
        llm.generate("hi", SamplingParams(logprob_token_ids=[10**7]))
    assert err.value.parameter == "logprob_token_ids"
