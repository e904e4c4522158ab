"""The GGUF block products (`engine/kernels/gguf_products.py`, `csrc/gguf.c`) and the blocks' float32
reference (`QuantizedWeight.dequantize`).

`dequantize()` equals gguf-py's `dequantize` bit for bit. The C products dequantize into the
same float32 weights and sum in float32, so they differ from the exact product of those weights
only by rounding in the sums. Each output sums K products in lanes of K / 32 fused
multiply-adds, then reduces two or four accumulators and 8 or 16 lanes (at most 5 more
additions), then adds the bias: at most n = K / 32 + 6 roundings on any term's way, so (Higham's
bound for any summation order) |y - exact| <= gamma_n (sum_k |x_k w_nk| + |b_n|), gamma_n =
n u / (1 - n u), u = 2^-24: 1.4e-6 of the magnitudes for K = 576, 3.2e-6 for K = 1536 (the
errors seen here stay under 3% of it). The lowest bit of one code wrong, at an input of 1, moves
a sum by 2 (Q8_0's 8-bit codes) to 200 (the 4-bit codes) times the bound at K = 576 / 768
(`test_the_tolerance_catches_one_wrong_code`); larger code errors by more.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from workbench.engine.kernels import c_library, gguf_products
from workbench.models.gguf_blocks import BLOCK_TYPES, QuantizedWeight

KINDS = sorted(BLOCK_TYPES)
ROWS = (1, 2, 3, 4, 5, 8, 13, 16, 33)
# where a block's codes are (its bytes [start, stop)): the rest are scales
CODES = {"Q4_0": (2, 18), "Q4_1": (4, 20), "Q8_0": (2, 34), "Q4_K": (16, 144),
         "Q5_K": (48, 176), "Q6_K": (0, 128)}
N = 37  # odd, and not a multiple of any vector width


def runs(isa: str) -> None:
    if isa not in gguf_products.isas():
        pytest.skip(f"this CPU (or {gguf_products.ISA_ENV}) does not run the {isa} kernels")


def in_features(kind: str, wide: bool = False) -> int:
    """K = 256 * 3 for the K-quants' 256-blocks; 576 or 1536 (SmolLM2's) for the 32-blocks."""
    if BLOCK_TYPES[kind].block_size == 256:
        return 768
    return 1536 if wide else 576


def reference(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact product of the dequantized weight (float64) and the module docstring's bound."""
    w = weight.dequantize().double()
    exact = x.double() @ w.T
    magnitude = x.double().abs() @ w.abs().T
    if bias is not None:
        exact, magnitude = exact + bias.double(), magnitude + bias.double().abs()
    n = weight.in_features // 32 + 6
    u = 2.0 ** -24
    return exact, n * u / (1 - n * u) * magnitude


def within(got: torch.Tensor, exact: torch.Tensor, tol: torch.Tensor) -> bool:
    return bool(((got.double() - exact).abs() <= tol).all())


def weight_and_input(kind: str, rows: int, seed: int = 0, wide: bool = False
                     ) -> tuple[QuantizedWeight, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    weight = gguf_products.random_blocks(kind, N, in_features(kind, wide), gen)
    return weight, torch.randn(rows, weight.in_features, generator=gen)


@pytest.mark.parametrize("kind", KINDS)
def test_dequantize_is_gguf_py_bit_for_bit(kind):
    weight, _ = weight_and_input(kind, 1)
    expected = quants.dequantize(weight.data.numpy(), GGMLQuantizationType[kind])
    got = weight.dequantize()
    assert got.dtype == torch.float32 and got.shape == weight.shape
    assert torch.equal(got.view(torch.int32), torch.from_numpy(expected).view(torch.int32))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_quantize_is_gguf_py(kind):
    w = torch.randn(6, 64, generator=torch.Generator().manual_seed(1))
    weight = QuantizedWeight.quantize(w, kind)
    expected = quants.quantize(w.numpy(), GGMLQuantizationType[kind])
    assert weight.shape == (6, 64) and np.array_equal(weight.data.numpy(), expected)
    assert (weight.dequantize() - w).abs().max() < 0.3  # 4 bits of a normal's range


def test_quantize_refuses_what_gguf_py_cannot_quantize():
    with pytest.raises(ValueError, match="Q4_K"):
        QuantizedWeight.quantize(torch.zeros(1, 256), "Q4_K")


@pytest.mark.parametrize("isa", gguf_products.ISAS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", ROWS)
def test_product_is_the_dequantized_product_up_to_summation_order(isa, kind, rows):
    runs(isa)
    weight, x = weight_and_input(kind, rows, seed=rows, wide=rows % 2 == 1)
    got = gguf_products.linear(x, weight, isa=isa)
    assert got.shape == (rows, N) and got.dtype == torch.float32
    assert within(got, *reference(x, weight))


@pytest.mark.parametrize("isa", gguf_products.ISAS)
@pytest.mark.parametrize("kind", KINDS)
def test_bias_and_leading_dimensions(isa, kind):
    runs(isa)
    weight, x = weight_and_input(kind, 6)
    bias = torch.randn(N, generator=torch.Generator().manual_seed(2))
    got = gguf_products.linear(x.view(2, 3, -1), weight, bias, isa=isa)
    assert got.shape == (2, 3, N)
    assert within(got.view(6, N), *reference(x, weight, bias))


@pytest.mark.parametrize("isa", gguf_products.ISAS)
@pytest.mark.parametrize("kind", KINDS)
def test_the_same_bits_for_any_thread_count_and_row_count(isa, kind):
    runs(isa)
    weight, x = weight_and_input(kind, 13)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gguf_products.linear(x, weight, isa=isa)
        alone = torch.cat([gguf_products.linear(x[i:i + 1], weight, isa=isa) for i in range(13)])
        torch.set_num_threads(2)
        two = gguf_products.linear(x, weight, isa=isa)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    assert torch.equal(one, alone)  # a row's sums do not depend on its chunk


@pytest.mark.parametrize("isa", gguf_products.ISAS)
@pytest.mark.parametrize("kind", KINDS)
def test_the_tolerance_catches_one_wrong_code(isa, kind):
    """A kernel that read one code of one block wrong (here: the reference's weight with one
    byte of codes changed) fails the bound: the tests above can fail on a real bug."""
    runs(isa)
    weight, x = weight_and_input(kind, 1)
    for at in range(*CODES[kind]):  # the first code byte whose weight's scale is not 0
        data = weight.data.clone()
        data[5, at] ^= 0x01  # the lowest bit of one code
        wrong = QuantizedWeight(kind, N, weight.in_features, data)
        changed = (wrong.dequantize() != weight.dequantize()).nonzero()
        if changed.shape[0]:
            break
    assert changed.shape[0] == 1 and changed[0, 0] == 5
    x[0, changed[0, 1]] = 1.0  # an input of a typical size at the wrong weight
    got = gguf_products.linear(x, weight, isa=isa)
    exact, tol = reference(x, wrong)
    assert within(got[:, :5], exact[:, :5], tol[:, :5])
    assert not within(got[:, 5], exact[:, 5], tol[:, 5])


@pytest.mark.parametrize("isa", gguf_products.ISAS)
def test_subnormal_scales_under_flushed_denormals(isa):
    """f16 scales below 2^-14 are float32 normals: the product reads them so on a thread that
    flushes denormals (the model thread does), as the reference computed without."""
    runs(isa)
    weight, x = weight_and_input("Q8_0", 3)
    data = weight.data.view(-1, 34).clone()
    data[:, :2] = torch.tensor([0x0123], dtype=torch.int16).view(torch.uint8)  # 291 * 2^-24
    weight = QuantizedWeight("Q8_0", N, weight.in_features, data.view(N, -1))
    exact, tol = reference(x, weight)
    assert torch.set_flush_denormal(True)
    try:
        got = gguf_products.linear(x, weight, isa=isa)
    finally:
        torch.set_flush_denormal(False)
    assert exact.abs().max() > 1e-4 and within(got, exact, tol)


def test_cat_and_select_rows():
    gen = torch.Generator().manual_seed(3)
    q, k = (gguf_products.random_blocks("Q4_1", n, 64, gen) for n in (6, 2))
    fused = QuantizedWeight.cat([q, k])
    assert fused.shape == (8, 64)
    assert torch.equal(fused.dequantize(), torch.cat([q.dequantize(), k.dequantize()]))
    order = torch.tensor([3, 0, 5, 1])
    assert torch.equal(q.select_rows(order).dequantize(), q.dequantize()[order])
    with pytest.raises(ValueError, match="one kind"):
        QuantizedWeight.cat([q, gguf_products.random_blocks("Q8_0", 2, 64, gen)])
    with pytest.raises(ValueError, match="out of"):
        q.select_rows([6])


def test_linear_refuses_what_it_cannot_read():
    weight, x = weight_and_input("Q8_0", 2)
    with pytest.raises(ValueError, match="float32"):
        gguf_products.linear(x.double(), weight)
    with pytest.raises(ValueError, match="bias"):
        gguf_products.linear(x, weight, torch.zeros(N + 1))
    with pytest.raises(ValueError, match="block type"):
        gguf_products.linear_function("Q2_K")


def test_the_isa_override(monkeypatch):
    if not gguf_products.available("avx2"):
        pytest.skip("the avx2 kernels do not run here")
    monkeypatch.setenv(gguf_products.ISA_ENV, "avx2")
    assert gguf_products.isas() == ["avx2"]
    assert gguf_products.linear_function("Q4_1") is c_library.library().wb_linear_q4_1_avx2
    monkeypatch.setenv(gguf_products.ISA_ENV, "sse2")
    with pytest.raises(ValueError, match="sse2"):
        gguf_products.isas()


@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump (binutils)")
def test_the_avx2_functions_hold_no_avx512_instruction():
    """No EVEX-encoded instruction (its first byte 0x62: AVX-512's only encoding) in the AVX2
    functions or the OpenMP bodies outlined from them."""
    if c_library.library() is None:
        pytest.skip("the C kernels did not build")
    dump = subprocess.run(["objdump", "-d", c_library.library()._name], capture_output=True,
                          text=True, check=True).stdout
    evex, seen, name = [], set(), ""
    for line in dump.splitlines():
        if line.endswith(">:"):
            name = line.split("<", 1)[1][:-2]
        elif "_avx2" in name and name.startswith("wb_linear_q"):
            seen.add(name.split(".")[0])
            if "\t62 " in line:
                evex.append((name, line))
    assert seen == {gguf_products.function_name(kind, "avx2") for kind in KINDS}
    assert not evex, evex[:3]
