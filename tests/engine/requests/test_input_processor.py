"""Request checks that need the model: vocabulary, context length, logprob cap, engine limits.

Each invalid request raises a ValidationError (a ValueError) naming the parameter and value, from
`LLM.generate` / `LLMEngine.add_request`, and leaves nothing queued behind.
"""

import pytest

from tests.engine.helpers import greedy, make_llm
from workbench.errors import ValidationError
from workbench.sampling_params import SamplingParams

VOCAB = 49152
MAX_LEN = 64


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return make_llm(tiny_llama, max_model_len=MAX_LEN, num_kv_blocks=8, max_logprobs=5,
                    max_num_seqs=4)


def refused(llm, prompt, params, parameter: str, value_text: str) -> None:
    with pytest.raises(ValidationError) as info:
        llm.generate(prompt, params)
    assert isinstance(info.value, ValueError)
    assert info.value.parameter == parameter
    assert value_text in str(info.value)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.llm_engine.block_manager.num_free_blocks == 8


TEN = list(range(100, 110))


@pytest.mark.parametrize("prompt, kwargs, parameter, value_text", [
    (TEN, dict(logprobs=6), "logprobs", "6"),
    (TEN, dict(prompt_logprobs=6), "prompt_logprobs", "6"),
    (TEN, dict(logprobs=-1), "logprobs", "-1"),
    (TEN, dict(max_tokens=MAX_LEN - 9), "max_tokens", str(MAX_LEN - 9)),
    (TEN, dict(max_tokens=None, min_tokens=60), "min_tokens", "60"),
    (list(range(MAX_LEN + 5)), dict(), "prompt", str(MAX_LEN + 5)),
    ({"prompt_token_ids": []}, dict(), "prompt", "[]"),
    ("", dict(), "prompt", "[]"),
    ([5, VOCAB], dict(), "prompt", str(VOCAB)),
    ([5, -1], dict(), "prompt", "-1"),
    (TEN, dict(stop_token_ids=[VOCAB + 3]), "stop_token_ids", str(VOCAB + 3)),
    (TEN, dict(logit_bias={VOCAB: 5.0}), "logit_bias", str(VOCAB)),
    (TEN, dict(allowed_token_ids=[3, VOCAB]), "allowed_token_ids", str(VOCAB)),
    (TEN, dict(truncate_prompt_tokens=MAX_LEN + 1), "truncate_prompt_tokens", str(MAX_LEN + 1)),
])
def test_invalid_request_is_refused_naming_parameter_and_value(llm, prompt, kwargs, parameter,
                                                                value_text):
    params = SamplingParams(temperature=0.0, **{"max_tokens": 4, **kwargs})
    refused(llm, prompt, params, parameter, value_text)


def test_one_invalid_prompt_in_a_batch_leaves_nothing_queued(llm):
    with pytest.raises(ValidationError):
        llm.generate([TEN, [5, VOCAB]], greedy(4))
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.llm_engine.block_manager.num_free_blocks == 8


def test_a_duplicate_request_id_is_refused(llm):
    engine = llm.llm_engine
    engine.add_request("dup", TEN, greedy(2))
    try:
        with pytest.raises(ValidationError) as info:
            engine.add_request("dup", TEN, greedy(2))
        assert info.value.parameter == "request_id" and "dup" in str(info.value)
    finally:
        engine.abort_request("dup")
        engine.step()
    assert not engine.has_unfinished_requests()


def test_a_lora_request_is_refused_when_lora_is_off(llm):
    with pytest.raises(ValidationError) as info:
        llm.llm_engine.add_request("lora", TEN, greedy(2), lora_request="adapter-x")
    assert info.value.parameter == "lora_request" and "adapter-x" in str(info.value)


def test_more_samples_than_max_num_seqs_are_refused_not_stuck(llm):
    with pytest.raises(ValidationError) as info:
        llm.llm_engine.add_request("wide", TEN, SamplingParams(n=5, max_tokens=2))
    assert info.value.parameter == "n" and "5" in str(info.value)
    assert not llm.llm_engine.has_unfinished_requests()


def test_max_tokens_none_fills_the_context(llm):
    req = llm.llm_engine.inputs.process("r", TEN, SamplingParams(max_tokens=None))
    assert req.params.max_tokens == MAX_LEN - len(TEN)


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm):
    out = llm.generate(TEN, greedy(1, truncate_prompt_tokens=3))[0]
    assert out.prompt_token_ids == TEN[-3:]


def test_a_prompt_longer_than_the_batch_budget_without_chunking_cannot_be_configured(tiny_llama):
    with pytest.raises(ValidationError) as info:
        make_llm(tiny_llama, max_model_len=64, num_kv_blocks=8, enable_chunked_prefill=False,
                 max_num_batched_tokens=16)
    assert info.value.parameter == "max_num_batched_tokens" and "16" in str(info.value)


def test_a_kv_cache_smaller_than_the_context_names_num_kv_blocks(tiny_llama):
    with pytest.raises(ValidationError) as info:
        make_llm(tiny_llama, max_model_len=64, block_size=4, num_kv_blocks=15)
    assert info.value.parameter == "num_kv_blocks" and "15" in str(info.value)
