"""Engine beam search against a plain reimplementation of the algorithm on transformers (fp32).

The reference (`reference_pool` and `rank` in `tests/engine/helpers.py`) is written from the
algorithm's description (issue 4 / vLLM's online beam search), not from
`workbench.engine.requests.beam_search`: every step, one forward pass of the HF model over all live beams
(no cache), top 2W raw logprobs each, EOS candidates complete, the best W others go on; final
ranking by cum_logprob / len ** length_penalty.
"""

from __future__ import annotations

import pytest

from tests.engine.helpers import make_llm, rank, reference_pool
from workbench.sampling_params import BeamSearchParams

WIDTHS = (1, 2, 4)
PENALTIES = (0.0, 1.0, 2.0)
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def real(default_model):
    return make_llm(default_model)


@pytest.fixture(scope="module")
def prompts(default_model):
    tok = default_model.tokenizer
    chat = tok.apply_chat_template([{"role": "user", "content": "Reply with one word: yes or no?"}],
                                   tokenize=False, add_generation_prompt=True)
    return [tok(chat)["input_ids"], tok("The capital of France is")["input_ids"],
            tok("def add(a, b):")["input_ids"]]


@pytest.fixture(scope="module")
def pools(default_model, prompts):
    """Reference pools per (prompt, width, ignore_eos): pruning does not use the penalty."""
    out = {(i, w, False): reference_pool(default_model, p, w, MAX_TOKENS, False)
           for i, p in enumerate(prompts) for w in WIDTHS}
    out |= {(0, w, True): reference_pool(default_model, prompts[0], w, MAX_TOKENS, True)
            for w in WIDTHS}  # the chat prompt, whose beams would otherwise end in EOS
    return out


def _check(outs, pools, prompts, width, lp, ignore_eos, eos):
    for i, (out, _prompt) in enumerate(zip(outs, prompts)):
        expected = rank(pools[(i, width, ignore_eos)], width, lp, eos)
        got = [(s.tokens, s.cum_logprob, s.finish_reason) for s in out.sequences]
        assert [g[0] for g in got] == [e[0] for e in expected], (i, width, lp)
        assert [g[2] for g in got] == [e[2] for e in expected]
        assert [g[1] for g in got] == pytest.approx([e[1] for e in expected], abs=2e-3)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("length_penalty", PENALTIES)
def test_matches_reference_with_eos(real, pools, prompts, default_model, width, length_penalty):
    params = BeamSearchParams(beam_width=width, max_tokens=MAX_TOKENS, length_penalty=length_penalty)
    outs = real.beam_search(prompts, params)
    _check(outs, pools, prompts, width, length_penalty, False, default_model.tokenizer.eos_token_id)


def test_eos_completes_beams_in_the_chat_prompt(pools):
    """The chat prompt's search really has EOS-completed beams (else the test above is weak)."""
    assert any(r == "stop" for _, _, r in pools[(0, 4, False)])


@pytest.mark.parametrize("width", WIDTHS)
def test_matches_reference_ignoring_eos(real, pools, prompts, default_model, width):
    params = BeamSearchParams(beam_width=width, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = real.beam_search(prompts[:1], params)
    _check(outs, pools, prompts[:1], width, 1.0, True, default_model.tokenizer.eos_token_id)
    assert all(s.finish_reason == "length" for o in outs for s in o.sequences)


def test_text_leaves_out_eos_and_tokens_keep_it_only_when_asked(real, prompts, default_model):
    eos = default_model.tokenizer.eos_token_id
    plain = real.beam_search(prompts[0], BeamSearchParams(beam_width=4, max_tokens=MAX_TOKENS))[0]
    kept = real.beam_search(prompts[0], BeamSearchParams(
        beam_width=4, max_tokens=MAX_TOKENS, include_stop_str_in_output=True))[0]
    stopped = [s for s in plain.sequences if s.finish_reason == "stop"]
    assert stopped and all(s.tokens[-1] != eos and s.stop_reason == eos for s in stopped)
    with_eos = [s for s in kept.sequences if s.finish_reason == "stop"]
    assert with_eos and all(s.tokens[-1] == eos for s in with_eos)
    assert all("<|im_end|>" not in s.text for s in kept.sequences)
    assert [s.cum_logprob for s in kept.sequences] == pytest.approx(
        [s.cum_logprob for s in plain.sequences])
