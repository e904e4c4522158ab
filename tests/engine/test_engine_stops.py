"""Stop conditions and output shaping end to end (tiny llama, greedy unless said otherwise).

Stop strings and stop token ids are picked from the model's own unconstrained greedy output, so
each test knows where the output must end. EOS is forced with a logit bias.
"""

import pytest

from tests.engine.helpers import greedy, make_llm
from workbench.sampling_params import RequestOutputKind, SamplingParams

PROMPT = "Once upon a time"
REPEATS = "The weather today is"  # greedy output repeats tokens: penalties must change it
NEW = 16


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return make_llm(tiny_llama, block_size=4, num_kv_blocks=128)


@pytest.fixture(scope="module")
def plain(llm):
    """The unconstrained greedy completion of PROMPT."""
    return llm.generate(PROMPT, greedy(NEW, ignore_eos=True))[0].outputs[0]


@pytest.fixture(scope="module")
def eos(tiny_llama):
    return tiny_llama.tokenizer.eos_token_id


def first_of(llm, prompt=PROMPT, **kwargs):
    return llm.generate(prompt, SamplingParams(**{"temperature": 0.0, "max_tokens": NEW,
                                                  **kwargs}))[0].outputs[0]


def test_max_tokens_ends_with_length(llm, plain):
    out = first_of(llm, max_tokens=5, ignore_eos=True)
    assert out.token_ids == plain.token_ids[:5]
    assert (out.finish_reason, out.stop_reason) == ("length", None)


def test_a_stop_string_truncates_the_text(llm, plain):
    stop = plain.text[8:12]
    out = first_of(llm, stop=[stop], ignore_eos=True)
    assert plain.text.find(stop) == 8
    assert out.text == plain.text[:8]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert len(out.token_ids) < NEW


def test_include_stop_str_in_output_keeps_the_stop_string(llm, plain):
    stop = plain.text[8:12]
    out = first_of(llm, stop=[stop], include_stop_str_in_output=True, ignore_eos=True)
    assert out.text == plain.text[:12]
    assert out.stop_reason == stop


def test_the_earliest_of_several_stop_strings_wins(llm, plain):
    late, early = plain.text[20:24], plain.text[6:9]
    assert plain.text.find(early) == 6 and plain.text.find(late) > 6
    out = first_of(llm, stop=[late, early], ignore_eos=True)
    assert out.stop_reason == early and out.text == plain.text[:6]


def test_a_stop_token_id_ends_the_output_and_is_the_stop_reason(llm, plain):
    at = 3
    stop_id = plain.token_ids[at]
    assert stop_id not in plain.token_ids[:at]
    out = first_of(llm, stop_token_ids=[stop_id], ignore_eos=True)
    assert out.token_ids == plain.token_ids[:at + 1]  # the stop token is in token_ids
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_id)
    assert out.text == first_of(llm, max_tokens=at, ignore_eos=True).text  # but not in text


def test_a_stop_token_text_shows_with_include_stop_str_in_output(llm, plain):
    stop_id = plain.token_ids[3]
    out = first_of(llm, stop_token_ids=[stop_id], include_stop_str_in_output=True, ignore_eos=True)
    assert out.text == first_of(llm, max_tokens=4, ignore_eos=True).text


def test_eos_stops_with_no_stop_reason(llm, eos):
    out = first_of(llm, logit_bias={eos: 100.0})
    assert out.token_ids == [eos]
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", None, "")


def test_ignore_eos_runs_to_max_tokens(llm, eos):
    out = first_of(llm, logit_bias={eos: 100.0}, ignore_eos=True, max_tokens=4)
    assert out.token_ids == [eos] * 4 and out.finish_reason == "length"


def test_min_tokens_bans_eos_until_reached(llm, eos):
    out = first_of(llm, logit_bias={eos: 100.0}, min_tokens=5)
    assert eos not in out.token_ids[:5]
    assert out.token_ids[5:] == [eos] and out.finish_reason == "stop"


def test_min_tokens_holds_back_stop_token_ids_too(llm, plain):
    stop_id = plain.token_ids[0]
    out = first_of(llm, stop_token_ids=[stop_id], min_tokens=3, ignore_eos=True)
    assert stop_id not in out.token_ids[1:3]
    assert len(out.token_ids) >= 3


def test_a_logit_bias_of_100_forces_the_token(llm):
    out = first_of(llm, logit_bias={1234: 100.0}, max_tokens=5)
    assert out.token_ids == [1234] * 5


def test_allowed_token_ids_are_the_only_ones_sampled(llm):
    allowed = [500, 600, 700, 800]
    params = SamplingParams(temperature=1.0, seed=0, max_tokens=30, allowed_token_ids=allowed)
    out = llm.generate(PROMPT, params)[0].outputs[0]
    assert set(out.token_ids) <= set(allowed) and len(set(out.token_ids)) > 1


def test_bad_words_never_appear(llm, plain, tiny_llama):
    token = plain.token_ids[1]
    word = tiny_llama.tokenizer.decode([token])
    assert tiny_llama.tokenizer(word, add_special_tokens=False)["input_ids"] == [token]
    out = first_of(llm, bad_words=[word.strip()], ignore_eos=True)
    assert token not in out.token_ids
    assert out.token_ids[0] == plain.token_ids[0]


def test_a_multi_token_bad_word_blocks_only_its_completion(llm, plain, tiny_llama):
    word = tiny_llama.tokenizer.decode(plain.token_ids[2:4])  # two tokens
    out = first_of(llm, bad_words=[word], ignore_eos=True)
    assert out.token_ids[:3] == plain.token_ids[:3]  # the first token of the word is allowed
    assert out.token_ids[3] != plain.token_ids[3]


@pytest.mark.parametrize("penalty", [dict(repetition_penalty=1.5), dict(presence_penalty=1.5),
                                     dict(frequency_penalty=1.5)])
def test_penalties_change_repetitive_greedy_output(llm, penalty):
    base = first_of(llm, REPEATS, ignore_eos=True)
    penalised = first_of(llm, REPEATS, ignore_eos=True, **penalty)
    assert len(set(base.token_ids)) < NEW  # the test prompt really repeats
    assert penalised.token_ids != base.token_ids
    assert len(set(penalised.token_ids)) > len(set(base.token_ids))


@pytest.mark.parametrize("penalty", [dict(presence_penalty=2.0), dict(frequency_penalty=2.0)])
def test_output_only_penalties_leave_the_first_token(llm, penalty):
    base = first_of(llm, REPEATS, ignore_eos=True)
    assert first_of(llm, REPEATS, ignore_eos=True, **penalty).token_ids[0] == base.token_ids[0]


def test_truncate_prompt_tokens_generates_from_the_last_tokens(llm, tiny_llama):
    ids = tiny_llama.tokenizer(PROMPT + " there was a dragon")["input_ids"]
    cut = llm.generate(ids, greedy(8, truncate_prompt_tokens=3))[0]
    short = llm.generate(ids[-3:], greedy(8))[0]
    assert cut.prompt_token_ids == ids[-3:]
    assert cut.outputs[0].token_ids == short.outputs[0].token_ids


@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens(llm, tiny_llama, skip):
    im_start = tiny_llama.tokenizer.convert_tokens_to_ids("<|im_start|>")
    out = first_of(llm, logit_bias={im_start: 100.0}, max_tokens=2, skip_special_tokens=skip,
                   spaces_between_special_tokens=False)
    assert out.token_ids == [im_start] * 2
    assert out.text == ("" if skip else "<|im_start|><|im_start|>")


def stream(llm, prompt, params) -> list:
    """All outputs of one request, stepping the engine by hand."""
    engine = llm.llm_engine
    engine.add_request("stream", prompt, params)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == "stream"]
    return outs


@pytest.mark.parametrize("stop, include", [([], False), (["zzz-never"], False),
                                           ("plain-stop", False), ("plain-stop", True)])
def test_delta_outputs_concatenate_to_the_cumulative_text(llm, plain, stop, include):
    stop = [plain.text[20:25]] if stop == "plain-stop" else stop
    kw = dict(temperature=0.0, max_tokens=NEW, ignore_eos=True, stop=stop,
              include_stop_str_in_output=include)
    deltas = stream(llm, PROMPT, SamplingParams(output_kind=RequestOutputKind.DELTA, **kw))
    cumulative = stream(llm, PROMPT, SamplingParams(**kw))
    final = cumulative[-1].outputs[0]
    assert len(deltas) > 1 and deltas[-1].finished and not deltas[0].finished
    assert "".join(d.outputs[0].text for d in deltas) == final.text
    assert sum((d.outputs[0].token_ids for d in deltas), []) == final.token_ids
    assert deltas[-1].outputs[0].finish_reason == final.finish_reason


def test_cumulative_outputs_grow_by_prefixes(llm):
    outs = stream(llm, PROMPT, SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True))
    texts = [o.outputs[0].text for o in outs]
    assert len(outs) == NEW
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))


def test_final_only_gives_one_output(llm):
    params = SamplingParams(temperature=0.0, max_tokens=NEW,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    outs = stream(llm, PROMPT, params)
    assert len(outs) == 1 and outs[0].finished


def test_delta_prompt_logprobs_come_once(llm):
    params = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=1,
                            output_kind=RequestOutputKind.DELTA)
    outs = stream(llm, PROMPT, params)
    assert [o.prompt_logprobs is not None for o in outs] == [True] + [False] * (len(outs) - 1)


def test_the_end_of_the_context_ends_with_length(tiny_llama):
    small = make_llm(tiny_llama, max_model_len=32, block_size=4, num_kv_blocks=8)
    ids = list(range(100, 110))
    out = small.generate(ids, SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 32 - 10
    assert out[0].outputs[0].finish_reason == "length"


def force_tokens(monkeypatch, engine, forced: list[int]) -> None:
    """The engine's sampler returns `forced` one token per step (single-request runs)."""
    import torch

    from workbench.engine.step.sampler import SampleResult

    stream = iter(forced)
    monkeypatch.setattr(engine.generation_handler, "sampler", lambda logits, rows: SampleResult(
        torch.tensor([next(stream) for _ in rows]), None, None, None, None))


MULTIBYTE = "héllo 你好 🙂!"


def test_streamed_text_never_carries_a_broken_character(llm, tiny_llama, monkeypatch):
    forced = tiny_llama.tokenizer(MULTIBYTE, add_special_tokens=False)["input_ids"]
    force_tokens(monkeypatch, llm.llm_engine, forced)
    params = SamplingParams(max_tokens=len(forced), output_kind=RequestOutputKind.DELTA)
    deltas = [d.outputs[0].text for d in stream(llm, PROMPT, params)]
    assert any(d == "" for d in deltas)  # some tokens end mid-character and add no text
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == MULTIBYTE


def test_a_stop_string_inside_multibyte_text(llm, tiny_llama, monkeypatch):
    forced = tiny_llama.tokenizer(MULTIBYTE, add_special_tokens=False)["input_ids"]
    force_tokens(monkeypatch, llm.llm_engine, forced)
    out = first_of(llm, stop=["好"], max_tokens=len(forced))
    assert (out.text, out.stop_reason) == ("héllo 你", "好")
