"""The opt-in compiled decode step (engine/compiled.py, `WORKBENCH_COMPILE=1`) decodes what the
eager loop decodes; without the variable nothing is compiled."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from tests.engine.helpers import make_llm
from workbench.engine import compiled
from workbench.sampling_params import SamplingParams

PROMPTS = ["Once upon a time, in a land far away, there lived a very small knight", "Hello"]


def _llm(loaded):
    return make_llm(dataclasses.replace(loaded, model=copy.deepcopy(loaded.model)), block_size=4)


def test_buckets_are_powers_of_two_from_the_minimum():
    assert [compiled.bucket(n) for n in (1, 128, 129, 256, 1000)] == [128, 128, 256, 256, 1024]


def test_off_by_default(tiny_llama, monkeypatch):
    monkeypatch.delenv(compiled.ENV, raising=False)
    assert _llm(tiny_llama).llm_engine.runner.compiled is None


def test_compiled_steps_decode_what_the_eager_loop_decodes(tiny_llama, monkeypatch):
    """float32: greedy tokens equal and logprobs within float rounding, for a lone stream
    (compiled steps) and for two at once (eager steps: a batch)."""
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=2, ignore_eos=True)
    results = []
    for flag in ("0", "1"):
        monkeypatch.setenv(compiled.ENV, flag)
        llm = _llm(tiny_llama)
        runner = llm.llm_engine.runner
        assert (runner.compiled is not None) == (flag == "1")
        calls = []
        if runner.compiled is not None:
            graph = runner.compiled.graph
            runner.compiled.graph = lambda *args: calls.append(1) or graph(*args)  # noqa: B023 - this engine's
        spans, span_of = [], runner._decode_span
        runner._decode_span = lambda decodes: spans.append(span_of(decodes)) or spans[-1] \
            if len(decodes) == 1 else None  # noqa: B023 - used by this iteration's engine only
        outs = [llm.generate(PROMPTS[0], params)[0]] + llm.generate(PROMPTS, params)
        outs += llm.generate(PROMPTS[0], params)  # a prefix-cache hit: blocks not consecutive
        # the lone streams' decode steps, and the cached prompt's one token left to compute
        assert len(calls) == (11 + 12 if flag == "1" else 0)
        assert None in spans and any(spans)  # in consecutive blocks or not
        results.append([o.outputs[0] for o in outs])
    eager, graph = results
    assert [c.token_ids for c in graph] == [c.token_ids for c in eager]
    for c_graph, c_eager in zip(graph, eager):
        for step_graph, step_eager in zip(c_graph.logprobs, c_eager.logprobs):
            assert step_graph.keys() == step_eager.keys()
            for tok in step_eager:
                assert step_graph[tok].logprob == pytest.approx(step_eager[tok].logprob, abs=1e-4)


def test_with_the_avx512bf16_kernel_the_graph_calls_its_c_products(monkeypatch):
    """The C kernel as an operator of its own: a compiled graph calls it (the same bits as
    eager, it is opaque to inductor), and the decode graph of a bf16 model on that kernel uses
    it for every projection."""
    import torch

    from workbench.engine import gemv, kernels
    from workbench.models.cpu import cpu_features

    lack = kernels.missing("avx512bf16", torch.bfloat16, cpu_features())
    if lack is not None:
        pytest.skip(f"the avx512bf16 kernel needs {lack}")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 96, generator=gen).to(torch.bfloat16)
    w = torch.randn(40, 96, generator=gen).to(torch.bfloat16)
    step = torch.compile(lambda a, b: torch.relu(gemv.linear_bf16_op(a, b)) * 2, dynamic=False)
    assert torch.equal(step(x, w), torch.relu(gemv.linear_bf16(x, w)) * 2)

    monkeypatch.setenv(compiled.ENV, "1")
    from workbench.models import tiny_model

    loaded = tiny_model("llama", dtype="bfloat16")  # unfused (an engine fuses its model in place)
    llm = make_llm(loaded, block_size=4, kernel="avx512bf16")
    graph = llm.llm_engine.runner.compiled.graph
    assert graph._orig_mod.linear is gemv.linear_bf16_op


def test_a_kernel_without_plain_weights_says_it_runs_eager(monkeypatch, caplog):
    """`onednn` keeps only oneDNN's packed weights: the flag is not dropped silently."""
    from workbench.engine import kernels
    from workbench.models import tiny_model
    from workbench.models.cpu import cpu_features

    if kernels.missing("onednn", torch.bfloat16, cpu_features()) is not None:
        pytest.skip("no oneDNN bf16 here")
    monkeypatch.setenv(compiled.ENV, "1")
    monkeypatch.setenv("WORKBENCH_KERNEL", "onednn")
    with caplog.at_level("WARNING"):
        llm = _llm(tiny_model("llama", dtype="bfloat16"))
    assert llm.llm_engine.runner.compiled is None
    assert "WORKBENCH_COMPILE: not with the onednn kernel" in caplog.text
