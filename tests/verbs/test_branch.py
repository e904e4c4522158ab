"""`LLM.branch`: an output forced at one position to another token and continued, on the tiny
llama. A branch is a fresh greedy generation of prompt + prefix + the forced token (tokens and
logprobs), its prefill a prefix-cache hit on the original's blocks; top-n alternatives, the
model asked where the output has no logprobs; refusals naming the parameter; the tree's
divergence points."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.engine.helpers import greedy, make_llm
from workbench.errors import ValidationError
from workbench.inspect.branch_tree import BranchTree
from workbench.sampling_params import SamplingParams

PROMPT = ("The quick brown fox jumps over the lazy dog, and then it runs far away into the "
          "deep green forest where")
MAX = 8


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return make_llm(tiny_llama, seed=0)


@pytest.fixture(scope="module")
def original(llm):
    return llm.generate(PROMPT, greedy(MAX, logprobs=3))[0]


def _ids(out) -> list[int]:
    return list(out.prompt_token_ids) + list(out.outputs[0].token_ids)


def _second_best(out, position: int) -> int:
    chosen = out.outputs[0].token_ids[position]
    lps = out.outputs[0].logprobs[position]
    return max((t for t in lps if t != chosen), key=lambda t: lps[t].logprob)


def test_prompt_is_longer_than_a_block(original):
    assert len(original.prompt_token_ids) > 16  # else no block of it could be a cache hit


def test_a_branch_equals_a_fresh_greedy_generation_of_prompt_prefix_and_token(llm, original):
    position, gen = 3, original.outputs[0].token_ids
    x = _second_best(original, position)
    tree = llm.branch(original, position, tokens=[x])
    (branch,) = tree.branches
    context = list(original.prompt_token_ids) + gen[:position] + [x]
    fresh = llm.generate({"prompt_token_ids": context}, greedy(MAX, logprobs=3))[0]
    assert branch.output.prompt_token_ids == context
    assert branch.output.outputs[0].token_ids == fresh.outputs[0].token_ids
    assert [t.token_id for t in branch.continuation] == fresh.outputs[0].token_ids
    for got, want in zip(branch.output.outputs[0].logprobs, fresh.outputs[0].logprobs):
        assert got.keys() == want.keys()
        for t in got:
            assert math.isclose(got[t].logprob, want[t].logprob, abs_tol=1e-5)
    assert branch.path.token_ids[:position] == gen[:position] and branch.token_id == x
    assert branch.token.logprob == original.outputs[0].logprobs[position][x].logprob


def test_the_branch_prefill_is_a_prefix_cache_hit(llm, original):
    bm = llm.llm_engine.block_manager
    hits = bm.prefix_hits
    tree = llm.branch(original, 5, tokens=[_second_best(original, 5)])
    branch = tree.branches[0]
    assert branch.num_cached_tokens > 0 and branch.num_cached_tokens % bm.block_size == 0
    assert branch.num_cached_tokens == branch.output.num_cached_tokens
    context = len(original.prompt_token_ids) + 5
    assert branch.num_cached_tokens == (context // bm.block_size) * bm.block_size
    assert bm.prefix_hits - hits == branch.num_cached_tokens // bm.block_size


def test_top_n_branches_on_the_best_alternatives_in_one_batch(llm, original):
    position = 2
    engine = llm.llm_engine
    before = engine.stats().num_steps
    lps = original.outputs[0].logprobs[position]
    chosen = original.outputs[0].token_ids[position]
    best = sorted((t for t in lps if t != chosen), key=lambda t: -lps[t].logprob)[:2]
    tree = llm.branch(original, position, top=2)
    assert [b.token_id for b in tree.branches] == best
    assert [b.token.logprob for b in tree.branches] == [lps[t].logprob for t in best]
    assert all(b.output.num_cached_tokens > 0 for b in tree.branches)
    assert [d["diverges_at"] for d in tree.divergences()] == [position, position]
    assert engine.stats().num_steps - before == MAX  # together: a prefill, MAX - 1 decodes


def test_top_n_without_logprobs_asks_the_model(llm):
    plain = llm.generate(PROMPT, greedy(MAX))[0]
    with_lps = llm.generate(PROMPT, greedy(MAX, logprobs=3))[0]
    tree = llm.branch(plain, 4, top=2)
    assert [b.token_id for b in tree.branches] == [
        t for t in sorted(with_lps.outputs[0].logprobs[4],
                          key=lambda t: -with_lps.outputs[0].logprobs[4][t].logprob)
        if t != plain.outputs[0].token_ids[4]][:2]
    for b in tree.branches:
        assert math.isclose(b.token.logprob, with_lps.outputs[0].logprobs[4][b.token_id].logprob,
                            abs_tol=1e-5)
        assert b.output.outputs[0].logprobs is not None  # logprobs=0 at least: the path's logprobs
    assert tree.original.cumulative_logprob is None  # the original's own are unknown


def test_a_forced_token_outside_the_top_gets_its_logprob_from_the_model(llm, original):
    position = 1
    x = next(t for t in range(100, 200) if t not in original.outputs[0].logprobs[position])
    tree = llm.branch(original, position, tokens=x)
    context = list(original.prompt_token_ids) + original.outputs[0].token_ids[:position]
    probe = llm.generate({"prompt_token_ids": context},
                         greedy(1, logprobs=0, logprob_token_ids=[x]))[0]
    assert math.isclose(tree.branches[0].token.logprob,
                        probe.outputs[0].logprobs[0][x].logprob, abs_tol=1e-5)
    cum = tree.branches[0].path.cumulative_logprob
    assert cum is not None and math.isclose(
        cum, sum(lp for lp in tree.branches[0].path.logprobs), abs_tol=1e-9)


def test_forcing_the_original_token_gives_the_original_back(llm, original):
    position = 3
    tree = llm.branch(original, position, tokens=[original.outputs[0].token_ids[position]],
                      params=greedy(MAX - position - 1, logprobs=3))
    assert tree.branches[0].path.token_ids == original.outputs[0].token_ids
    assert tree.diverges_at(0) is None


def test_params_change_the_continuation(llm, original):
    tree = llm.branch(original, 0, top=1, params=greedy(2))
    assert len(tree.branches[0].continuation) == 2
    assert tree.branches[0].path.logprobs[1:] and all(
        lp is not None for lp in tree.branches[0].path.logprobs[1:])


@pytest.mark.parametrize(("kwargs", "parameter"), [
    ({"position": MAX, "tokens": [5]}, "position"),
    ({"position": -1, "tokens": [5]}, "position"),
    ({"position": "1", "tokens": [5]}, "position"),
    ({"position": 1, "tokens": [10 ** 9]}, "tokens"),
    ({"position": 1, "tokens": [-3]}, "tokens"),
    ({"position": 1, "tokens": []}, "tokens"),
    ({"position": 1, "tokens": [5, 5]}, "tokens"),
    ({"position": 1}, "tokens"),
    ({"position": 1, "tokens": [5], "top": 2}, "top"),
    ({"position": 1, "top": 0}, "top"),
    ({"position": 1, "top": 4}, "top"),  # logprobs=3: three alternatives at most
    ({"position": 1, "tokens": [5], "index": 1}, "index"),
    ({"position": 1, "tokens": [5], "params": SamplingParams(n=2, max_tokens=2)}, "params"),
])
def test_refusals_name_the_parameter(llm, original, kwargs, parameter):
    with pytest.raises(ValidationError) as err:
        llm.branch(original, **kwargs)
    assert err.value.parameter == parameter
    assert f"parameter={parameter}" in str(err.value)


def test_structured_outputs_are_refused_and_numpy_ids_taken(llm, original):
    import numpy as np

    from workbench.sampling_params import StructuredOutputsParams

    constrained = greedy(4, structured_outputs=StructuredOutputsParams(regex="[a-z ]+"))
    with pytest.raises(ValidationError, match="grammar") as err:
        llm.branch(original, 1, tokens=[5], params=constrained)
    assert err.value.parameter == "params"
    tree = llm.branch(original, np.int64(1), tokens=np.array([5, 6]))
    assert [b.token_id for b in tree.branches] == [5, 6]
    assert all(type(b.position) is int and type(b.token_id) is int for b in tree.branches)


def test_a_position_without_alternatives_is_refused(llm):
    bare = llm.generate(PROMPT, greedy(4, logprobs=0))[0]
    with pytest.raises(ValidationError, match="no alternatives") as err:
        llm.branch(bare, 1, top=1)
    assert err.value.parameter == "top"


def test_top_over_the_engines_logprob_cap_is_refused_by_name(llm):
    plain = llm.generate(PROMPT, greedy(3))[0]
    with pytest.raises(ValidationError, match="max_logprobs=20") as err:
        llm.branch(plain, 1, top=20)
    assert err.value.parameter == "top"


def test_an_output_of_unknown_params_needs_params(llm, original):
    stranger = replace(original, request_id="elsewhere-1")
    with pytest.raises(ValidationError, match="pass params=") as err:
        llm.branch(stranger, 1, tokens=[5])
    assert err.value.parameter == "params"
    assert llm.branch(stranger, 1, tokens=[5], params=greedy(2)).branches[0].token_id == 5


def test_the_tree_to_dict_frame_and_html(llm, original):
    tree = llm.branch(original, 2, top=2)
    data = tree.to_dict()
    assert [b["diverges_at"] for b in data["branches"]] == [2, 2]
    assert data["original"]["token_ids"] == original.outputs[0].token_ids
    df = tree.to_frame()
    assert list(df["path"].unique()) == ["original", "branch 0", "branch 1"]
    own = df[df["path"] == "branch 0"]
    assert own["position"].min() == 2 and bool(own["forced"].iloc[0])
    assert math.isclose(own["cum_logprob"].iloc[-1], tree.branches[0].path.cumulative_logprob)
    html = tree._repr_html_()
    assert html == tree._repr_html_() and "wb-branch-tree" in html and "wb-theme" in html
    assert BranchTree.of(original, llm.get_tokenizer()).branches == []


def test_a_branch_of_a_branch(llm, original):
    first = llm.branch(original, 2, top=1).branches[0].output
    tree = llm.branch(first, 1, top=1)
    assert tree.branches[0].output.num_cached_tokens > 0
