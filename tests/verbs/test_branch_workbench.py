"""`Workbench.branch`: branches through completions requests of token ids, in the kernel and
over HTTP (`serve_in_kernel`), equal to the offline `LLM.branch`. On the tiny llama."""

from __future__ import annotations

import math

import pytest

from tests.engine.helpers import greedy
from workbench.errors import ValidationError

PROMPT = ("The quick brown fox jumps over the lazy dog, and then it runs far away into the "
          "deep green forest where")
MAX = 6
IDS = {"return_token_ids": True, "return_tokens_as_token_ids": True}


@pytest.fixture(scope="module")
def llm(tiny_llama):
    from workbench import LLM

    return LLM(tiny_llama, max_model_len=128, block_size=16, num_kv_blocks=64, seed=0)


@pytest.fixture(scope="module")
def offline(llm):
    return llm.generate(PROMPT, greedy(MAX, logprobs=3))[0]


def _tokenizer(llm, where: str):
    """The tiny model is none of our aliases: a remote Workbench is given its tokenizer."""
    return llm.get_tokenizer() if where == "remote" else None


def _same(tree, want) -> None:
    assert [b.token_id for b in tree.branches] == [b.token_id for b in want.branches]
    for got, ref in zip(tree.branches, want.branches):
        assert got.position == ref.position
        assert got.path.token_ids == ref.path.token_ids
        assert got.path.text == ref.path.text
        for a, b in zip(got.path.logprobs, ref.path.logprobs):
            assert (a is None) == (b is None) and (a is None or math.isclose(a, b, abs_tol=1e-5))
    assert [d["diverges_at"] for d in tree.divergences()] == [
        d["diverges_at"] for d in want.divergences()]


@pytest.mark.parametrize("where", ["local", "remote"])
def test_top_n_branches_equal_the_offline_ones(request, llm, offline, where):
    wb = request.getfixturevalue(where)
    result = wb.completions(PROMPT, max_tokens=MAX, temperature=0, logprobs=3, **IDS)
    assert result.ok, result.error
    assert result.response["choices"][0]["prompt_token_ids"] == offline.prompt_token_ids
    assert result.request["logprobs"] == 3
    bm = llm.llm_engine.block_manager
    hits = bm.prefix_hits
    tree = wb.branch(result, 2, top=2, tokenizer=_tokenizer(llm, where))
    assert bm.prefix_hits - hits >= 2  # each branch's prefill: the shared blocks, from the cache
    _same(tree, llm.branch(offline, 2, top=2))
    assert all(b.output["prompt_token_ids"][-1] == b.token_id for b in tree.branches)


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_token_outside_the_top_and_a_result_without_logprobs(request, llm, offline, where):
    wb = request.getfixturevalue(where)
    plain = wb.completions(PROMPT, max_tokens=MAX, temperature=0, **IDS)
    x = next(t for t in range(100, 200) if t not in offline.outputs[0].logprobs[1])
    tok = _tokenizer(llm, where)
    plain_offline = llm.generate(PROMPT, greedy(MAX))[0]
    _same(wb.branch(plain, 1, tokens=[x], logprobs=3, tokenizer=tok),
          llm.branch(plain_offline, 1, tokens=[x], params=greedy(MAX, logprobs=3)))
    _same(wb.branch(plain, 3, top=2, tokenizer=tok), llm.branch(plain_offline, 3, top=2))


def test_body_fields_override_the_original_request(local):
    result = local.completions(PROMPT, max_tokens=MAX, temperature=0, logprobs=2, **IDS)
    tree = local.branch(result, 0, top=1, max_tokens=2)
    assert len(tree.branches[0].continuation) == 2


def test_refusals_name_the_parameter(local):
    bare = local.completions(PROMPT, max_tokens=3, temperature=0)
    with pytest.raises(ValidationError) as err:
        local.branch(bare, 0, top=1)
    assert err.value.parameter == "return_token_ids"
    chat = local.chat([{"role": "user", "content": "hi"}], max_tokens=2)
    with pytest.raises(ValidationError) as err:
        local.branch(chat, 0, top=1)
    assert err.value.parameter == "result"
    good = local.completions(PROMPT, max_tokens=3, temperature=0, logprobs=2, **IDS)
    for kwargs, parameter in [({"position": 3, "top": 1}, "position"),
                              ({"position": 0, "tokens": [10 ** 7]}, "tokens"),
                              ({"position": 0, "top": 1, "echo": True}, "echo"),
                              ({"position": 0, "top": 1, "n": 2}, "n"),
                              ({"position": 0, "top": 1,
                                "response_format": {"type": "json_object"}}, "response_format"),
                              ({"position": 0, "top": 1, "index": 2}, "index")]:
        with pytest.raises(ValidationError) as err:
            local.branch(good, **kwargs)
        assert err.value.parameter == parameter, kwargs


@pytest.mark.parametrize("where", ["local", "remote"])
def test_the_token_explorer_on_a_workbench(request, llm, offline, where):
    from workbench.widgets import TokenExplorer

    wb = request.getfixturevalue(where)
    result = wb.completions(PROMPT, max_tokens=MAX, temperature=0, logprobs=3, **IDS)
    ex = TokenExplorer(wb, result, tokenizer=_tokenizer(llm, where))
    ex.position.value = 2
    alt = ex.alternative.options[0][1]
    ex.alternative.value = alt
    assert ex.status.value == "" and ex.branch is not None
    _same(ex.tree, llm.branch(offline, 2, tokens=[alt]))
