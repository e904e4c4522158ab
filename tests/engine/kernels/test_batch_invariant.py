"""`LLM(batch_invariant=True)`: a request's tokens and logprobs are the same bits whatever shares
its batch, however its prompt is chunked, with or without prefix-cache hits, on every family
the engine runs (mixtures of experts refused), in float32 and bfloat16, on the kernel this
process runs (`make test-portable` runs this file on every kernel the CPU has and under the
AVX2 limits). The parts: each kernel's products computed in fixed tiles give a row the same
bits whatever rows come with it (`FastLinear.tile_rows`), and the C attention
(`c_attention.paged_attention`) is attention per query token, windowed, soft-capped and with ALiBi,
to float32 rounding, and the decode attention's bits where it has none of those. The invariant C
products ("avx2", "avx512bf16": every row count in one call) give a row the same bits for any
row count, position and thread count, and a decode step of many rows still goes in one C call."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from tests.engine.helpers import make_llm, needs_c
from tests.engine.step import test_architectures as arch_tests
from tests.engine.step import test_inspection as inspection_tests
from workbench.engine.kernels import c_attention, c_products, projections
from workbench.engine.step.fusion import FastLinear, make_batch_invariant
from workbench.errors import ValidationError
from workbench.models import tiny_model
from workbench.models.architectures import supported_types
from workbench.models.cpu import cpu_features
from workbench.sampling_params import SamplingParams

EXPERTS = ("mixtral", "qwen2_moe")
FAMILIES = [f for f in supported_types() if f not in EXPERTS]
DTYPES = [torch.float32, torch.bfloat16]


def _kernels_for(dtype: torch.dtype) -> list[str]:
    return [k for k in projections.runnable(dtype) if k in ("torch", *projections.DTYPE_OF)
            and projections.DTYPE_OF.get(k, dtype) == dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_each_kernels_tiled_products_give_a_row_the_same_bits_whatever_rows_share_it(dtype):
    gen = torch.Generator().manual_seed(0)
    k, n = 96, 200
    weight = torch.randn(n, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    x = torch.randn(300, k, generator=gen).to(dtype)
    checked = []
    for kernel in _kernels_for(dtype):
        linear = FastLinear(weight, bias, kernel)
        linear.tile_rows = 4
        full = linear(x)
        for rows in (1, 2, 3, 5, 7, 13, 16, 17, 33, 64, 300):
            assert torch.equal(linear(x[:rows]), full[:rows]), (kernel, rows)
        for i in (0, 5, 39, 299):  # alone, whatever its neighbours were
            assert torch.equal(linear(x[i:i + 1]), full[i:i + 1]), (kernel, i)
        shuffled = torch.randperm(300, generator=gen)
        assert torch.equal(linear(x[shuffled]), full[shuffled]), kernel
        expected = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
        tolerance = 1e-4 if dtype == torch.float32 else 2 ** -7  # one rounding of the output
        assert ((full.float() - expected).abs() <= tolerance * (1 + expected.abs())).all()
        checked.append(kernel)
    assert "torch" in checked


# the invariant C products: (kernel, dtype, the library's function)
INVARIANT_PRODUCTS = [("avx2", torch.float32, "wb_linear_f32_invariant"),
                      ("avx2", torch.float32, "wb_linear_f32_invariant_avx512"),
                      ("avx512bf16", torch.bfloat16, "wb_linear_bf16")]


def _invariant_function(kernel: str, dtype: torch.dtype, name: str):
    """The library's invariant product `name`, or a skip where this process cannot run it."""
    from workbench.engine.kernels import c_library

    lack = projections.missing(kernel, dtype, cpu_features())
    if lack is not None:
        pytest.skip(f"the {kernel} kernel needs {lack}")
    if name.endswith("avx512") and not c_products.available_avx512():
        pytest.skip("this CPU has no AVX-512F")
    return getattr(c_library.library(), name)


def _call(fn, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
          threads: int = 2) -> torch.Tensor:
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    fn(x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
       out.data_ptr(), x.shape[0], weight.shape[0], x.shape[1], threads)
    return out


@pytest.mark.parametrize("kernel, dtype, name", INVARIANT_PRODUCTS)
@pytest.mark.parametrize("k", [576, 45, 1536])
def test_the_invariant_products_give_a_row_its_bits_for_any_count_position_and_threads(
        kernel, dtype, name, k):
    """One call for any row count: a row's output is the same bits alone, among 2 to 5 (on
    AVX2, 1 to 6 rows take the weight rows into the lanes), 7, 64 or 300 rows (partial panels,
    a K that is odd or past a span), at any position, on 1 to 3 threads; within one rounding of
    the exact product."""
    fn = _invariant_function(kernel, dtype, name)
    gen = torch.Generator().manual_seed(k)
    weight = torch.randn(203, k, generator=gen).to(dtype)  # 203: a partial block and group
    bias = torch.randn(203, generator=gen).to(dtype)
    x = torch.randn(300, k, generator=gen).to(dtype)
    full = _call(fn, x, weight, bias)
    for rows in (1, 2, 3, 4, 5, 7, 64, 300):
        for start in sorted({0, 3, 137, 300 - rows}):
            start = min(start, 300 - rows)
            for threads in (1, 3):
                got = _call(fn, x[start:start + rows].contiguous(), weight, bias, threads)
                assert torch.equal(got, full[start:start + rows]), (rows, start, threads)
    assert torch.equal(_call(fn, x[:5].contiguous(), weight, None), _call(
        fn, x, weight, None)[:5])  # without a bias too
    exact = x.double() @ weight.double().T + bias.double()
    if dtype == torch.float32:
        torch.testing.assert_close(full.double(), exact, rtol=1e-5, atol=1e-6 * k)
    else:  # float32 sums, one rounding
        assert ((full.double() - exact).abs() <= 2 ** -7 * (1 + exact.abs())).all()


@pytest.mark.parametrize("kernel, dtype, name", INVARIANT_PRODUCTS[:2])
def test_the_invariant_products_are_the_broadcast_tiles_bits(kernel, dtype, name):
    """float32: every row through the broadcast tiles, the bits of the kernel's own 16-row
    broadcast tiles (AVX2's from 7 rows, the same on AVX-512F). (bfloat16 has one function.)"""
    fn = _invariant_function(kernel, dtype, name)
    tiles = c_products.linear_function()
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(150, 300, generator=gen).to(dtype)
    bias = torch.randn(150, generator=gen).to(dtype)
    x = torch.randn(16, 300, generator=gen).to(dtype)
    assert torch.equal(_call(fn, x, weight, bias), _call(tiles, x, weight, bias))


@pytest.mark.parametrize("k", [576, 45])
def test_avx2s_products_are_the_invariant_bits_for_every_row_count(k):
    """`wb_linear_f32` (AVX2's products, up to 48 rows a call in the default engine) sums each
    output as the invariant products do, one to six rows with the weight rows in the lanes, more
    through the broadcast tiles: any row count gives a row the invariant bits."""
    fn = _invariant_function("avx2", torch.float32, "wb_linear_f32_invariant")
    from workbench.engine.kernels import c_library

    few = c_library.library().wb_linear_f32
    gen = torch.Generator().manual_seed(k)
    weight, bias = torch.randn(203, k, generator=gen), torch.randn(203, generator=gen)
    x = torch.randn(300, k, generator=gen)
    full = _call(fn, x, weight, bias)
    for rows in (1, 2, 3, 4, 5, 6, 7, 16, 48):
        assert torch.equal(_call(few, x[:rows].contiguous(), weight, bias), full[:rows]), rows


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_kernel_with_invariant_products_takes_every_row_in_one_call(dtype, monkeypatch):
    """`FastLinear` with `tile_rows` on "avx2" / "avx512bf16": 300 rows in one C call, and
    `c_function` (what the one-call decode step runs) gives that function for any count."""
    kernel = {torch.float32: "avx2", torch.bfloat16: "avx512bf16"}[dtype]
    if projections.missing(kernel, dtype, cpu_features()) is not None:
        pytest.skip(f"no {kernel} kernel here")
    gen = torch.Generator().manual_seed(0)
    linear = FastLinear(torch.randn(70, 64, generator=gen).to(dtype), None, kernel)
    linear.tile_rows = 4
    invariant = linear.kernel.invariant_function(linear.weights, dtype)
    assert invariant is not None
    assert all(linear.c_function(rows, dtype) is invariant for rows in (1, 5, 16, 300))
    calls = []
    real = c_products.product
    monkeypatch.setattr(c_products, "product", lambda fn, *a, **k: calls.append(fn) or real(
        fn, *a, **k))
    linear(torch.randn(300, 64, generator=gen).to(dtype))
    assert calls == [invariant]


@needs_c
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_invariant_decode_step_of_many_rows_goes_in_one_c_call(dtype, monkeypatch):
    """With invariant products every decode step goes in one C call (`c_decode_stack`),
    whatever its row count, and gives the loop's bits."""
    from workbench.engine.kernels import c_decode_stack

    base = tiny_model("llama", dtype=dtype)
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 17, 40, 9, 6, 12, 20)]
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=3, ignore_eos=True)
    outs = {}
    for run in ("stack", "loop"):
        llm = make_llm(dataclasses.replace(base, model=copy.deepcopy(base.model)),
                       block_size=4, batch_invariant=True)
        stack = llm.llm_engine.runner.stack
        if stack.c_layers is None or stack.c_layers[0].qkv.kernel.invariant_function(
                stack.c_layers[0].qkv.weights, getattr(torch, dtype)) is None:
            pytest.skip("no invariant C products here")
        rows = []
        real = c_decode_stack.decode_stack
        monkeypatch.setattr(c_decode_stack, "decode_stack",
                            lambda *a, rows=rows, real=real: rows.append(a[2].shape[0])
                            or real(*a))
        if run == "loop":
            stack.c_layers = None
        outs[run] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        if run == "stack":
            assert max(rows) == len(prompts)
        monkeypatch.undo()
    for stack_out, loop_out in zip(outs["stack"], outs["loop"], strict=True):
        assert stack_out.token_ids == loop_out.token_ids
        assert stack_out.logprobs == loop_out.logprobs


def _attention_case(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    slots_total, hq, hkv, d = 256, 8, 2, 64
    k_cache = torch.randn(slots_total, hkv, d, generator=gen).to(dtype)
    v_cache = torch.randn(slots_total, hkv, d, generator=gen).to(dtype)
    # two sequences' contexts of 40 and 9 slots; tokens: four of the first, the second's last
    contexts = [torch.randperm(slots_total, generator=gen)[:40],
                torch.randperm(slots_total, generator=gen)[:9]]
    lengths = torch.tensor([1, 17, 39, 40, 9])
    offsets = torch.tensor([0, 0, 0, 0, 40])
    q = torch.randn(5, hq, d, generator=gen).to(dtype)
    return q, k_cache, v_cache, torch.cat(contexts), offsets, lengths


def _reference(q, k_cache, v_cache, slots, offsets, lengths, scale, window, softcap, slopes,
               alibi_scale):
    out = []
    hq, hkv = q.shape[1], k_cache.shape[1]
    for t in range(q.shape[0]):
        length = int(lengths[t])
        first = max(0, length - window) if window else 0
        ctx = slots[int(offsets[t]) + first:int(offsets[t]) + length]
        k = k_cache[ctx].double().repeat_interleave(hq // hkv, 1).transpose(0, 1)  # [Hq, L, D]
        v = v_cache[ctx].double().repeat_interleave(hq // hkv, 1).transpose(0, 1)
        s = (q[t].double()[:, None, :] * k).sum(-1) * scale  # [Hq, L]
        if softcap:
            s = torch.tanh(s / softcap) * softcap
        if slopes is not None:
            s = s + slopes.double()[:, None] * torch.arange(first, length).double() * alibi_scale
        out.append(torch.einsum("hl,hld->hd", s.softmax(-1), v))
    return torch.stack(out)


@needs_c
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("window, softcap, alibi", [(None, None, False), (7, None, False),
                                                    (None, 3.0, False), (None, None, True),
                                                    (16, 2.0, True)])
def test_paged_attention_is_attention_per_query_token(dtype, window, softcap, alibi):
    q, k_cache, v_cache, slots, offsets, lengths = _attention_case(dtype)
    slopes = torch.tensor([2 ** -(i + 1) for i in range(8)]) if alibi else None
    scale = 1 / math.sqrt(64)
    out = c_attention.paged_attention(q, k_cache, v_cache, slots, offsets, lengths, 40, scale, window,
                               softcap, slopes, 0.5 if alibi else 1.0)
    assert out is not None and out.dtype == dtype
    expected = _reference(q, k_cache, v_cache, slots, offsets, lengths, scale, window, softcap,
                          slopes, 0.5 if alibi else 1.0)
    assert (out.double() - expected).abs().max() < (1e-5 if dtype == torch.float32 else 2e-2)
    # each token alone: the same bits
    for t in range(5):
        alone = c_attention.paged_attention(q[t:t + 1], k_cache, v_cache, slots, offsets[t:t + 1],
                                     lengths[t:t + 1], int(lengths[t]), scale, window, softcap,
                                     slopes, 0.5 if alibi else 1.0)
        assert torch.equal(alone, out[t:t + 1])


@needs_c
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_attention_without_extras_is_the_decode_attentions_bits(dtype):
    q, k_cache, v_cache, slots, offsets, lengths = _attention_case(dtype)
    out = c_attention.paged_attention(q, k_cache, v_cache, slots, offsets, lengths, 40, 0.125)
    table = torch.stack([slots[o:o + 40] if o == 0 else torch.cat(
        [slots[o:], slots[:40 - (len(slots) - o)]]) for o in offsets.tolist()])
    decode = c_attention.decode_attention(q, k_cache, v_cache, table, lengths, 0.125)
    assert torch.equal(out, decode)


TARGET = "The quick brown fox jumps over the lazy dog and then it"
OTHERS = ["Hi", "Once upon a time there was a very long story about " * 3, "1 2 3 4 5",
          "Paris is", "a " * 40, "Tell me", "x"]


def _runs(llm, params):
    """The target request's (tokens, logprobs, prompt logprobs) alone first, then in batches of
    other prompts (before and after it, greedy and seeded sampling beside it), then again with
    its prompt in the prefix cache."""
    seeded = SamplingParams(max_tokens=6, temperature=0.9, seed=3)

    def target_of(prompts, index, others_params=None):
        every = [others_params or params] * len(prompts)
        every[index] = params
        out = llm.generate(prompts, every)[index]
        o = out.outputs[0]
        return (o.token_ids, [lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs)],
                [None if p is None else sorted((i, x.logprob) for i, x in p.items())
                 for p in out.prompt_logprobs])

    runs = {"alone": target_of([TARGET], 0)}
    runs["in a batch of 8"] = target_of([TARGET] + OTHERS, 0)
    runs["last of a batch"] = target_of(OTHERS[::-1] + [TARGET], len(OTHERS))
    runs["beside sampling"] = target_of(OTHERS[:3] + [TARGET], 3, seeded)
    runs["warm cache"] = target_of([TARGET], 0)
    return runs


def _assert_identical(runs, where):
    alone = runs.pop("alone")
    assert alone[0], where
    for name, got in runs.items():
        assert got == alone, f"{where}: {name} differs from alone"


@needs_c
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_request_is_the_same_bits_in_any_batch_on_every_family(family, dtype):
    # 24 tokens a step: the target's prompt is chunked differently in each batch
    llm = make_llm(tiny_model(family, seed=0, dtype=dtype), batch_invariant=True,
                   max_num_batched_tokens=24, max_model_len=512, num_kv_blocks=256)
    params = SamplingParams(max_tokens=10, temperature=0.0, logprobs=2, prompt_logprobs=1)
    _assert_identical(_runs(llm, params), f"{family} {dtype}")


@needs_c
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_real_model_is_the_same_bits_in_any_batch(dtype):
    from workbench import LLM

    llm = LLM("smollm2-135m-instruct", dtype=dtype, batch_invariant=True,
              max_num_batched_tokens=32, max_model_len=1024, kv_cache_memory_gb=0.25)
    params = SamplingParams(max_tokens=12, temperature=0.0, logprobs=5, prompt_logprobs=1,
                            token_stats=True)
    _assert_identical(_runs(llm, params), dtype)


@needs_c
def test_it_refuses_what_it_cannot_make_invariant():
    with pytest.raises(ValidationError) as error:
        make_llm(tiny_model("mixtral", seed=0), batch_invariant=True)
    assert error.value.parameter == "batch_invariant" and "experts" in str(error.value)
    with pytest.raises(ValidationError) as error:
        make_llm(tiny_model("llama", seed=0), batch_invariant=True, enable_lora=True)
    assert error.value.parameter == "batch_invariant" and "LoRA" in str(error.value)
    with pytest.raises(ValidationError) as error:
        make_llm(tiny_model("llama", seed=0), batch_invariant="yes")
    assert error.value.parameter == "batch_invariant"


def test_an_encoder_is_refused():
    from workbench import LLM

    with pytest.raises(ValidationError) as error:
        LLM("all-minilm-l6-v2", batch_invariant=True)
    assert error.value.parameter == "batch_invariant" and "encoder" in str(error.value)


def test_every_projection_of_every_family_is_tiled():
    for family in FAMILIES:
        model = tiny_model(family, seed=0).model
        make_batch_invariant(model, "torch")
        plain = [name for name, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"]
        assert not plain, (family, plain)
        assert all(m.tile_rows for m in model.modules() if isinstance(m, FastLinear)), family


@needs_c
def test_the_llm_says_it_is_batch_invariant():
    llm = make_llm(tiny_model("llama", seed=0), batch_invariant=True)
    assert repr(llm).endswith("batch_invariant=True)")
    assert "batch_invariant" in llm._repr_html_()
    assert "batch_invariant" not in repr(make_llm(tiny_model("llama", seed=0)))


# -- exact against transformers, as the default engine is (tests/engine/step/test_architectures.py) --

@needs_c
@pytest.mark.parametrize("family", FAMILIES)
def test_the_invariant_engine_is_token_identical_to_transformers_in_a_mixed_batch(family):
    """Three prompts batched together, prefilled 8 tokens a step: greedy tokens equal
    transformers' `generate`, logprobs within 1e-5, as the default engine's."""
    loaded, ref = arch_tests.pristine(family)
    expected = arch_tests.reference(ref, arch_tests.PROMPTS, 12)
    llm = make_llm(loaded, batch_invariant=True, max_num_batched_tokens=8)
    arch_tests.assert_exact(llm.generate(arch_tests.PROMPTS, arch_tests.greedy(12)), expected)


@needs_c
@pytest.mark.parametrize("family, overrides", [
    ("mistral", dict(sliding_window=8)), ("gemma2", {}), ("starcoder2", dict(sliding_window=8))])
def test_the_invariant_attention_keeps_sliding_windows_exact(family, overrides):
    loaded, ref = arch_tests.pristine(family, **overrides)
    expected = arch_tests.reference(ref, arch_tests.LONG, 12)
    llm = make_llm(loaded, batch_invariant=True, block_size=4, num_kv_blocks=128)
    arch_tests.assert_exact(llm.generate(arch_tests.LONG, arch_tests.greedy(12)), expected)


@needs_c
@pytest.mark.parametrize("family", ["llama", "gpt2", "falcon"])
def test_the_invariant_engines_captures_equal_transformers_hidden_states(family):
    loaded, ref = inspection_tests.pristine(family)
    params = inspection_tests.greedy(capture={"sites": ["resid_pre"]})
    out = make_llm(loaded, batch_invariant=True).generate(
        inspection_tests.PROMPTS, [params, inspection_tests.greedy(), params])[0]
    states = inspection_tests.hidden_states(ref, inspection_tests.sequence(out))
    for layer in range(ref.model.config.num_hidden_layers):
        inspection_tests.close(out.activations["resid_pre", layer], states[layer][0])


@needs_c
def test_the_invariant_engine_in_bfloat16_stays_close_to_transformers():
    for family in ("llama", "gpt2", "gpt_neox", "gemma2"):
        loaded, ref = arch_tests.pristine(family, dtype="bfloat16")
        ids = ref.tokenizer(arch_tests.PROMPTS[0])["input_ids"]
        with torch.inference_mode():
            want = torch.log_softmax(ref.model(torch.tensor([ids])).logits[0, -1].float(), -1)
        got = make_llm(loaded, batch_invariant=True).generate(
            arch_tests.PROMPTS[:1], SamplingParams(temperature=0, max_tokens=1, logprobs=5)
        )[0].outputs[0].logprobs[0]
        assert max(abs(lp.logprob - want[t].item()) for t, lp in got.items()) < 0.05, family


@pytest.mark.parametrize("k", [576, 45, 100])
def test_avx2s_products_on_bfloat16_weights_are_the_float32_weights_bits(k):
    """`wb_linear_f32_w16` (a float32 model whose checkpoint is bfloat16, its weights kept as
    they are) widens each weight exactly as it reads it and sums as the invariant products do:
    the bits of the float32 weight it stands for, for every row count (one to six in the
    transposed blocks, one and two rows two spans side by side; seven and more in the tiles
    with a span's weights widened; K's tails: 45 and 100 are no multiple of the span)."""
    fn = _invariant_function("avx2", torch.float32, "wb_linear_f32_invariant")
    w16 = c_products.linear_w16_function()
    gen = torch.Generator().manual_seed(k)
    weight, bias = torch.randn(203, k, generator=gen).bfloat16(), torch.randn(203, generator=gen)
    x = torch.randn(300, k, generator=gen)
    full = _call(fn, x, weight.float(), bias)
    for rows in (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 48, 300):
        assert torch.equal(_call(w16, x[:rows].contiguous(), weight, bias), full[:rows]), rows
