"""Decode attention in C (`gemv.decode_attention`, chosen as `KernelChoice.attention == "c"`):
the same function as SDPA over the gathered context, within float32 (or one bf16) rounding, for
grouped-query heads, padded batches and contexts of any length; the same bits for any thread
count; and the engine's tokens and logprobs with it as with SDPA."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from tests.engine.helpers import make_llm
from tests.engine.test_kernels import every_build, simulated  # noqa: F401 (a fixture)
from workbench.engine import gemv, kernels
from workbench.engine.attention import decode_attention
from workbench.models import tiny_model
from workbench.models.cpu import cpu_features
from workbench.sampling_params import SamplingParams

needs_c = pytest.mark.skipif(not (cpu_features().has("avx2", "fma") and gemv.available()),
                             reason="the C kernels need AVX2, FMA and a C compiler")


def case(dtype, batch=5, hq=9, hkv=3, d=64, lengths=(1, 5, 17, 70, 33), seed=0):
    """Random q (a row slice of a wider tensor, as the decoder passes it), caches, a shuffled
    slot table padded past each length, and the float64 reference output."""
    gen = torch.Generator().manual_seed(seed)
    slots_total, lmax = 512, max(lengths)
    k_cache = torch.randn(slots_total, hkv, d, generator=gen).to(dtype)
    v_cache = torch.randn(slots_total, hkv, d, generator=gen).to(dtype)
    wide = torch.randn(batch, hq + hkv, d, generator=gen).to(dtype)
    q = wide[:, :hq]  # not contiguous across the batch
    slots = torch.randperm(slots_total, generator=gen)[:batch * (lmax + 3)].view(batch, -1)
    slots = slots[:, :lmax]  # a row slice too
    lens = torch.tensor(lengths[:batch])
    mask = torch.arange(lmax)[None] < lens[:, None]
    scale = d ** -0.5
    kd = k_cache[slots.flatten()].view(batch, lmax, hkv, d).double()
    vd = v_cache[slots.flatten()].view(batch, lmax, hkv, d).double()
    expected = decode_attention(q.double(), kd, vd, mask, scale)
    return q, k_cache, v_cache, slots, lens, scale, expected


@needs_c
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 2 ** -8)])
@pytest.mark.parametrize("hq, hkv, d", [(9, 3, 64), (4, 4, 8), (8, 2, 128), (16, 1, 24)])
def test_c_decode_attention_equals_the_exact_result(dtype, tol, hq, hkv, d):
    q, k_cache, v_cache, slots, lens, scale, expected = case(dtype, hq=hq, hkv=hkv, d=d)
    out = gemv.decode_attention(q, k_cache, v_cache, slots, lens, scale)
    assert out is not None and out.dtype == dtype and out.shape == q.shape
    # float32: summation order only; bfloat16: one rounding of the float32 result
    assert torch.allclose(out.double(), expected, rtol=tol, atol=tol)


@needs_c
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_c_decode_attention_does_not_depend_on_the_thread_count(dtype):
    q, k_cache, v_cache, slots, lens, scale, _ = case(dtype, batch=4, lengths=(70, 9, 64, 1))
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(gemv.decode_attention(q, k_cache, v_cache, slots, lens, scale))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@needs_c
def test_shapes_it_does_not_take_fall_back():
    q, k_cache, v_cache, slots, lens, scale, _ = case(torch.float32, hq=4, hkv=4, d=12)
    assert gemv.decode_attention(q, k_cache, v_cache, slots, lens, scale) is None  # d % 8
    q, k_cache, v_cache, slots, lens, scale, _ = case(torch.float32, hq=17, hkv=1, d=8)
    assert gemv.decode_attention(q, k_cache, v_cache, slots, lens, scale) is None  # 17 per head


@pytest.mark.parametrize("machine, dtype, kernel, attention", [
    ("avx2", torch.float32, "auto", "c"), ("amx", torch.bfloat16, "auto", "c"),
    ("avx512", torch.bfloat16, "onednn", "c"), ("amx", torch.float32, "torch", "sdpa"),
    ("no-avx2", torch.float32, "auto", "sdpa"),
])
def test_the_choice_names_the_attention(machine, dtype, kernel, attention, every_build):  # noqa: F811
    choice = kernels.choose(dtype, "cpu", kernel, features=simulated(machine))
    assert choice.attention == attention and f"attention {attention}" in choice.describe()
    assert kernels.choose(dtype, "cuda").attention == "sdpa"


def test_without_the_library_attention_is_sdpa(every_build, monkeypatch):  # noqa: F811
    monkeypatch.setattr(gemv, "available", lambda: False)
    assert kernels.choose(torch.bfloat16, "cpu", features=simulated("amx")).attention == "sdpa"


@needs_c
def test_the_engine_gives_the_same_tokens_with_c_and_sdpa_attention(monkeypatch):
    """Four sequences of different lengths decoding together (padded batches), greedy, float32
    (a random tiny model's bf16 logits tie too often for tokens to be compared across
    kernels; the bf16 function itself is checked above)."""
    base = tiny_model("llama", dtype="float32")
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 17, 40, 9)]
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=2, ignore_eos=True)
    computed = []
    real = gemv.decode_attention
    monkeypatch.setattr(gemv, "decode_attention",
                        lambda *args: computed.append(real(*args)) or computed[-1])
    results = {}
    for attention in ("c", "sdpa"):
        llm = make_llm(dataclasses.replace(base, model=copy.deepcopy(base.model)), block_size=4)
        runner = llm.llm_engine.runner
        runner.kernel = dataclasses.replace(runner.kernel, attention=attention)
        outs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        results[attention] = outs
        assert (attention == "c") == bool(computed) and None not in computed
        computed.clear()
    for c, sdpa in zip(results["c"], results["sdpa"], strict=True):
        assert c.token_ids == sdpa.token_ids
        for step_c, step_s in zip(c.logprobs, sdpa.logprobs, strict=True):
            for token, lp in step_c.items():
                if token in step_s:
                    assert abs(lp.logprob - step_s[token].logprob) < 1e-5
