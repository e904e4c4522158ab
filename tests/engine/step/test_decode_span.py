"""A lone decode whose blocks are consecutive reads its context as a view of the KV cache
(`AttentionContext.decode_span`), with the same results as the gather it replaces."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import pytest

from tests.engine.helpers import make_llm
from workbench.engine.step import attention
from workbench.models import tiny_model
from workbench.sampling_params import SamplingParams

PROMPT = "Once upon a time, in a land far away, there lived a very small knight"


def _decode(computed: int, blocks: list[int]):
    return SimpleNamespace(seq=SimpleNamespace(num_computed_tokens=computed, block_table=blocks))


def test_span_only_for_one_decode_in_consecutive_blocks(tiny_llama):
    runner = make_llm(dataclasses.replace(tiny_llama, model=copy.deepcopy(tiny_llama.model)),
                      block_size=4).llm_engine.runner
    assert runner._decode_span([_decode(9, [3, 4, 5])]) == (12, 10)
    assert runner._decode_span([_decode(7, [3, 4, 9])]) == (12, 8)  # block 9 not read yet
    assert runner._decode_span([_decode(9, [3, 5, 6])]) is None
    assert runner._decode_span([_decode(3, [3]), _decode(3, [4])]) is None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_span_reads_what_the_gather_reads(dtype, monkeypatch):
    """Tokens and logprobs bit for bit, with and without the span."""
    base = tiny_model("llama", dtype=dtype)
    params = SamplingParams(max_tokens=20, temperature=0, logprobs=3, ignore_eos=True)
    spans = []
    real = attention._attend_decodes

    def counting(ctx, *args):
        spans.append(ctx.decode_span)
        return real(ctx, *args)

    monkeypatch.setattr(attention, "_attend_decodes", counting)
    results = []
    for use_span in (True, False):
        llm = make_llm(dataclasses.replace(base, model=copy.deepcopy(base.model)), block_size=4)
        runner = llm.llm_engine.runner  # the span is SDPA's: C attention reads slots in place
        runner.kernel = dataclasses.replace(runner.kernel, ops="torch")
        if not use_span:
            llm.llm_engine.runner._decode_span = lambda decodes: None
        out = llm.generate(PROMPT, params)[0].outputs[0]
        results.append((list(out.token_ids), out.logprobs))
    assert results[0] == results[1]
    assert any(s is not None for s in spans) and None in spans
