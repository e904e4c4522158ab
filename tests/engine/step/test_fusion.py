"""Fused projections and the kernels behind them compute what the separate linears did.

A test of a kernel skips, through `projections.missing`, exactly where the engine would not choose
that kernel (the same capability probe), so the suite passes on every x86-64 CPU; `make
test-portable` forces each kernel this CPU can run through the engine tests.
"""

import copy

import pytest
import torch

from workbench.engine.kernels import c_products, projections
from workbench.engine.kernels.projections import Avx2
from workbench.engine.step.fusion import (
    FastLinear,
    FusedPart,
    fuse_projections,
)
from workbench.models import tiny_model
from workbench.models.cpu import cpu_features


def needs(kernel: str, dtype: torch.dtype) -> None:
    lack = projections.missing(kernel, dtype, cpu_features())
    if lack is not None:
        pytest.skip(f"the {kernel} kernel needs {lack}")


def test_fusion_replaces_every_projection_group():
    model = copy.deepcopy(tiny_model("llama").model)
    assert fuse_projections(model) == 2 * model.config.num_hidden_layers
    attn = model.model.layers[0].self_attn
    assert all(isinstance(getattr(attn, n), FusedPart) for n in ("q_proj", "k_proj", "v_proj"))


def test_a_fused_model_refuses_to_be_saved(tmp_path):
    """Its projections' weights live in the kernels' layout, not in the state dict: saving it
    would write a checkpoint without them (loaded later with random weights), so it says why."""
    model = copy.deepcopy(tiny_model("llama").model)
    fuse_projections(model)
    with pytest.raises(RuntimeError, match="model.layers.0.self_attn.q_proj belongs to a "
                                           "workbench engine"):
        model.state_dict()
    with pytest.raises(RuntimeError, match="Save it .* before handing it to LLM"):
        model.save_pretrained(tmp_path)


@pytest.mark.parametrize("kernel", projections.KERNELS)
def test_fused_model_gives_the_same_logits(kernel):
    """Every kernel this machine runs, in its dtype: logits of one row (decoding) and of a
    prompt (prefill) agree with transformers' unfused model within that dtype's rounding."""
    dtype = torch.float32 if kernel in ("avx2", "torch") else torch.bfloat16
    needs(kernel, dtype)
    lm = tiny_model("qwen2", dtype=dtype)  # q/k/v with biases
    fused = copy.deepcopy(lm.model)
    fuse_projections(fused, kernel)
    ids = lm.tokenizer("The quick brown fox jumps", return_tensors="pt").input_ids
    tol = 1e-5 if dtype == torch.float32 else 0.02
    with torch.inference_mode():
        for part in (ids[:, :1], ids):
            torch.testing.assert_close(fused(part).logits.float(), lm.model(part).logits.float(),
                                       rtol=tol, atol=tol)


def test_a_part_called_alone_computes_its_own_slice():
    lm = tiny_model("llama")
    k_weight = lm.model.model.layers[0].self_attn.k_proj.weight.detach().clone()
    model = copy.deepcopy(lm.model)
    fuse_projections(model)
    x = torch.randn(1, 3, lm.config.hidden_size)
    k = model.model.layers[0].self_attn.k_proj(x)  # no q_proj call before it
    torch.testing.assert_close(k, x @ k_weight.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7, 16, Avx2.MAX_ROWS, Avx2.MAX_ROWS + 1])
@pytest.mark.parametrize("bias", [True, False])
def test_avx2_products_equal_float64_within_float32_rounding(rows, bias):
    """Few rows go through the C kernel, more through BLAS; shapes that leave partial blocks
    (weight rows not a multiple of 4, K not a multiple of 8, an odd number of input rows)."""
    needs("avx2", torch.float32)
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(99, 67, generator=gen)
    b = torch.randn(99, generator=gen) if bias else None
    x = torch.randn(1, rows, 67, generator=gen)
    got = FastLinear(weight, b, "avx2")(x)
    exact = x.double() @ weight.double().T + (0 if b is None else b.double())
    assert got.shape == (1, rows, 99) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("function", ["wb_linear_f32", "wb_linear_f32_avx512"])
@pytest.mark.parametrize("rows, k", [(1, 67), (3, 16), (5, 33), (6, 40), (16, 576), (13, 100), (7, 5),
                                     (9, 67), (17, 1536), (25, 13), (48, 96)])
def test_both_float32_c_functions_equal_float64(function, rows, k):
    """The AVX2 and the AVX-512F function, each called directly (the kernel uses the second
    where the CPU has AVX-512F): partial blocks of weight and input rows, K tails, the AVX2
    function's dot products (up to six rows) and broadcast tiles (seven on: one or two columns
    of eight rows, some padded); the same bits with one thread and three."""
    needs("avx2", torch.float32)
    from workbench.engine.kernels import c_library

    if function.endswith("avx512") and not c_products.available_avx512():
        pytest.skip("this CPU has no AVX-512F")
    fn = getattr(c_library.library(), function)
    gen = torch.Generator().manual_seed(rows)
    weight, b = torch.randn(99, k, generator=gen), torch.randn(99, generator=gen)
    x = torch.randn(rows, k, generator=gen)
    outs = []
    for threads in (1, 3):
        out = torch.empty(rows, 99)
        fn(x.data_ptr(), weight.data_ptr(), b.data_ptr(), out.data_ptr(), rows, 99, k, threads)
        outs.append(out)
    exact = x.double() @ weight.double().T + b.double()
    torch.testing.assert_close(outs[0].double(), exact, rtol=1e-5, atol=1e-6 * k)  # k sums
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("rows", [13, 16])
def test_avx512_broadcast_tiles_give_the_avx2_tiles_bits(rows):
    """13 to 16 rows on AVX-512F: one column of sixteen rows a vector, each sum over k in the
    AVX2 tiles' order and restarts, so the same bits as those (and within float32 rounding)."""
    needs("avx2", torch.float32)
    from workbench.engine.kernels import c_library

    if not c_products.available_avx512():
        pytest.skip("this CPU has no AVX-512F")
    lib = c_library.library()
    gen = torch.Generator().manual_seed(rows)
    weight, b = torch.randn(203, 300, generator=gen), torch.randn(203, generator=gen)
    x = torch.randn(rows, 300, generator=gen)
    outs = []
    for fn in (lib.wb_linear_f32, lib.wb_linear_f32_avx512):
        out = torch.empty(rows, 203)
        fn(x.data_ptr(), weight.data_ptr(), b.data_ptr(), out.data_ptr(), rows, 203, 300, 2)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    exact = x.double() @ weight.double().T + b.double()
    torch.testing.assert_close(outs[1].double(), exact, rtol=1e-5, atol=1e-6 * 300)


def test_avx2_broadcast_tiles_give_a_row_the_same_bits_in_any_batch():
    """From seven rows on, each sum runs over k in one order whatever the other rows: a row's
    output does not depend on how many rows share the call or where it sits among them."""
    needs("avx2", torch.float32)
    from workbench.engine.kernels import c_library

    fn = c_library.library().wb_linear_f32
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(50, 200, generator=gen)
    x = torch.randn(40, 200, generator=gen)

    def product(rows: torch.Tensor) -> torch.Tensor:
        out = torch.empty(rows.shape[0], 50)
        fn(rows.data_ptr(), weight.data_ptr(), None, out.data_ptr(), rows.shape[0], 50, 200, 2)
        return out

    full = product(x)
    for start, stop in ((0, 7), (3, 12), (10, 26), (0, 40), (33, 40)):
        assert torch.equal(product(x[start:stop].contiguous()), full[start:stop]), (start, stop)
    exact = x.double() @ weight.double().T
    torch.testing.assert_close(full.double(), exact, rtol=1e-5, atol=1e-6 * 200)


@pytest.mark.parametrize("kernel, dtype, rows", [
    ("avx2", torch.float32, 3), ("avx2", torch.float32, 16),  # dot products, broadcast tiles
    ("avx512bf16", torch.bfloat16, 2), ("avx512bf16", torch.bfloat16, 16)])
def test_c_products_do_not_depend_on_the_thread_count(kernel, dtype, rows):
    needs(kernel, dtype)

    linear = c_products.linear if kernel == "avx2" else c_products.linear_bf16
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(517, 96, generator=gen).to(dtype)
    x = torch.randn(rows, 96, generator=gen).to(dtype)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(linear(x, weight))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_prepacked_bf16_projections_are_bit_identical():
    needs("onednn", torch.bfloat16)
    lm = tiny_model("llama", dtype="bfloat16")
    packed = copy.deepcopy(lm.model)
    fuse_projections(packed, kernel="onednn")
    assert isinstance(packed.lm_head, FastLinear) and packed.lm_head.kernel.name == "onednn"
    assert isinstance(packed.model.layers[0].mlp.down_proj, FastLinear)
    ids = lm.tokenizer("The quick brown fox jumps", return_tensors="pt").input_ids
    with torch.inference_mode():
        assert torch.equal(packed(ids).logits, lm.model(ids).logits)


@pytest.mark.parametrize("rows", [1, 2, 4, 5, 11, 12, 16, 17, 70])
@pytest.mark.parametrize("k", [64, 67, 96])
@pytest.mark.parametrize("bias", [True, False])
def test_avx512bf16_products_equal_float32_arithmetic_rounded_once(rows, k, bias):
    """Every row count goes through the one C AVX-512 BF16 function on the one plain weight;
    partial blocks of weight rows (99 is not a multiple of 4) and of K (67, 96: masked tails).
    Each output is within one bf16 rounding of the exact product, rarely a last bit off
    oneDNN's, and a row's bits are its bits alone (the batch-invariant engine's function)."""
    needs("avx512bf16", torch.bfloat16)
    gen = torch.Generator().manual_seed(rows * k)
    weight = torch.randn(99, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(99, generator=gen).to(torch.bfloat16) if bias else None
    x = torch.randn(1, rows, k, generator=gen).to(torch.bfloat16)
    linear = FastLinear(weight, b, "avx512bf16")
    assert linear.weights.packed is None and linear.c_weight() is linear.weight  # one copy
    got = linear(x)
    exact = x.double() @ weight.double().T + (0 if b is None else b.double())
    assert got.shape == (1, rows, 99) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), exact, rtol=2 ** -8, atol=1e-3)
    reference = torch.nn.functional.linear(x, weight, b)  # oneDNN
    assert (got != reference).float().mean() < 0.05
    assert linear.c_function(rows, torch.bfloat16) is linear.kernel.invariant_function(
        linear.weights, torch.bfloat16)
    alone = torch.cat([linear(x[:, i:i + 1]) for i in range(rows)], dim=1)
    assert torch.equal(got, alone)


@pytest.mark.parametrize("rows", [1, 4, 16, 17, 32, 33, 100])
@pytest.mark.parametrize("n, k", [(99, 67), (48, 64), (20, 1536)])
@pytest.mark.parametrize("bias", [True, False])
def test_amx_products_equal_float32_arithmetic_rounded_once(rows, n, k, bias):
    """Every row count on AMX tiles (the weight in their layout, its only copy, zero padded
    where N is not a multiple of 16 or K of 32; rows past 16 in further tiles). Each output
    within one bf16 rounding of the exact product, rarely a last bit off oneDNN's."""
    needs("amx", torch.bfloat16)
    gen = torch.Generator().manual_seed(rows * k + n)
    weight = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, generator=gen).to(torch.bfloat16) if bias else None
    x = torch.randn(1, rows, k, generator=gen).to(torch.bfloat16)
    linear = FastLinear(weight, b, "amx")
    assert linear.weight is None and linear.weights.packed is None  # the tiles alone
    assert linear.c_weight() is not None
    got = linear(x)
    exact = x.double() @ weight.double().T + (0 if b is None else b.double())
    assert got.shape == (1, rows, n) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), exact, rtol=2 ** -8, atol=1e-3 * k ** 0.5)
    reference = torch.nn.functional.linear(x, weight, b)  # oneDNN
    assert (got != reference).float().mean() < 0.05


@pytest.mark.parametrize("kernel, dtype", [("avx512bf16", torch.bfloat16), ("avx2", torch.float32)])
def test_the_tied_lm_head_shares_the_embedding_weight(kernel, dtype):
    needs(kernel, dtype)
    model = copy.deepcopy(tiny_model("llama", dtype=dtype).model)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    fuse_projections(model, kernel=kernel)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
