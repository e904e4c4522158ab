"""SamplingParams: every invalid value raises a ValidationError naming the parameter and value.

Checks that need a model (vocabulary, max_logprobs, max_model_len) are in
test_input_processor.py.
"""

import pytest

from workbench.errors import ValidationError
from workbench.sampling_params import RequestOutputKind, SamplingParams


def check_refused(parameter: str, value_text: str, **kwargs) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        SamplingParams(**kwargs)
    exc = info.value
    assert isinstance(exc, ValueError)
    assert exc.parameter == parameter
    assert value_text in str(exc)
    return exc


@pytest.mark.parametrize("parameter, value_text, kwargs", [
    ("temperature", "-0.5", dict(temperature=-0.5)),
    ("temperature", "nan", dict(temperature=float("nan"))),
    ("top_p", "0.0", dict(top_p=0.0)),
    ("top_p", "1.5", dict(top_p=1.5)),
    ("top_p", "-0.1", dict(top_p=-0.1)),
    ("top_k", "-2", dict(top_k=-2)),
    ("min_p", "-0.1", dict(min_p=-0.1)),
    ("min_p", "1.1", dict(min_p=1.1)),
    ("n", "0", dict(n=0)),
    ("n", "-3", dict(n=-3)),
    ("n", "2", dict(n=2, temperature=0.0)),
    ("max_tokens", "0", dict(max_tokens=0)),
    ("max_tokens", "-5", dict(max_tokens=-5)),
    ("min_tokens", "9", dict(min_tokens=9, max_tokens=4)),
    ("min_tokens", "-1", dict(min_tokens=-1)),
    ("logprobs", "-2", dict(logprobs=-2)),
    ("prompt_logprobs", "-2", dict(prompt_logprobs=-2)),
    ("stop", "''", dict(stop=["ok", ""])),
    ("stop", "''", dict(stop="")),
    ("bad_words", "''", dict(bad_words=[""])),
    ("presence_penalty", "2.5", dict(presence_penalty=2.5)),
    ("presence_penalty", "-2.1", dict(presence_penalty=-2.1)),
    ("frequency_penalty", "3.0", dict(frequency_penalty=3.0)),
    ("frequency_penalty", "-2.5", dict(frequency_penalty=-2.5)),
    ("repetition_penalty", "0.0", dict(repetition_penalty=0.0)),
    ("repetition_penalty", "-1.0", dict(repetition_penalty=-1.0)),
    ("truncate_prompt_tokens", "0", dict(truncate_prompt_tokens=0)),
    ("truncate_prompt_tokens", "-3", dict(truncate_prompt_tokens=-3)),
    ("allowed_token_ids", "[]", dict(allowed_token_ids=[])),
    ("logit_bias", "abc", dict(logit_bias={"abc": 1.0})),
])
def test_invalid_value_is_refused_naming_parameter_and_value(parameter, value_text, kwargs):
    check_refused(parameter, value_text, **kwargs)


def test_validation_error_is_a_value_error_carrying_the_value():
    exc = check_refused("top_p", "1.5", top_p=1.5)
    assert exc.value == 1.5


@pytest.mark.parametrize("kwargs", [
    dict(temperature=0.0), dict(top_p=1.0), dict(top_k=-1), dict(top_k=0), dict(min_p=1.0),
    dict(presence_penalty=2.0, frequency_penalty=-2.0), dict(logprobs=-1), dict(n=4),
    dict(min_tokens=4, max_tokens=4), dict(truncate_prompt_tokens=-1), dict(max_tokens=None),
])
def test_boundary_values_are_accepted(kwargs):
    SamplingParams(**kwargs)


def test_top_k_minus_one_means_disabled():
    assert SamplingParams(top_k=-1).top_k == 0


def test_greedy_resets_the_truncation_knobs():
    p = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2)
    assert p.greedy and (p.top_p, p.top_k, p.min_p) == (1.0, 0, 0.0)


def test_a_tiny_positive_temperature_is_raised_to_the_minimum():
    assert SamplingParams(temperature=1e-3).temperature == 0.01


def test_stop_string_becomes_a_list_and_stop_token_ids_are_stop_ids():
    p = SamplingParams(stop="###", stop_token_ids=[5, 7])
    assert p.stop == ["###"] and p._all_stop_token_ids == {5, 7}


def test_logit_bias_keys_become_ints_and_values_are_clamped():
    p = SamplingParams(logit_bias={"12": 500.0, 3: -500.0})
    assert p.logit_bias == {12: 100.0, 3: -100.0}


def test_seed_minus_one_means_unseeded():
    assert SamplingParams(seed=-1).seed is None


@pytest.mark.parametrize("parameter, value_text, kwargs", [
    ("logprobs", "6", dict(logprobs=6)),
    ("prompt_logprobs", "7", dict(prompt_logprobs=7)),
    ("stop_token_ids", "100", dict(stop_token_ids=[3, 100])),
    ("logit_bias", "100", dict(logit_bias={100: 1.0})),
    ("allowed_token_ids", "100", dict(allowed_token_ids=[1, 100])),
])
def test_verify_refuses_what_the_model_cannot_honour(parameter, value_text, kwargs):
    with pytest.raises(ValidationError) as info:
        SamplingParams(**kwargs).verify(vocab_size=100, max_logprobs=5)
    assert info.value.parameter == parameter
    assert value_text in str(info.value)


def test_verify_accepts_any_logprob_count_when_the_cap_is_off():
    SamplingParams(logprobs=50, prompt_logprobs=-1).verify(vocab_size=100, max_logprobs=-1)


def test_clone_is_independent():
    p = SamplingParams(stop=["a"], output_kind=RequestOutputKind.DELTA)
    q = p.clone()
    q.stop.append("b")
    assert p.stop == ["a"] and q.output_kind is RequestOutputKind.DELTA
