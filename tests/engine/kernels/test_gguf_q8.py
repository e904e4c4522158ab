"""The q8 GGUF products (`gguf_q8`, `csrc/gguf_q8.c`): llama.cpp's activation quantizers byte for
byte, and the int8 block products equal to the integer sums times the scales up to float32
summation order.

The oracle for the quantizers is a NumPy port of llama.cpp's x86 quantizers written here:
Q8_0 / Q8_1 as `quantize_row_q8_0` / `_q8_1`'s AVX2 path (d = amax / 127 as fp16, q =
round-half-even(x * (127 / amax)), Q8_1's s = fp16(d * sum q) with the fp32 d), Q8_K as
`quantize_row_q8_K_ref` (max the first of largest |x|, iscale = -127 / max, q = min(127,
round-half-even(iscale * x)), d = 1 / iscale, bsums of 16). NumPy's float32 arithmetic and
float16 conversion round as the C code's (IEEE, to nearest even).

The products' bound (`gguf_q8.error_bound`): each of the float32 roundings (the fused
multiply-adds per block, a K-quant block's int32 sum to float, the tail's lanes' tree) is
within half an ulp of a
partial sum no larger than the sum of the absolute terms, so |got - exact| <= (2 * blocks + 8)
* 2^-24 * sum |fp32(d_w d_a) * codes' products| (+ the mins' terms); K-quants (3 * blocks + 8).
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch

from workbench.engine.kernels import c_library, gguf_products, gguf_q8
from workbench.models.cpu import cpu_features
from workbench.models.gguf_blocks import BLOCK_TYPES, QuantizedWeight

pytestmark = pytest.mark.skipif(
    not cpu_features().has("avx2", "fma", "f16c") or c_library.library() is None,
    reason="the q8 GGUF kernels need AVX2, FMA, F16C and the C library")

KINDS = sorted(BLOCK_TYPES)
ISAS = list(gguf_q8.ISAS)


def runs(isa: str) -> None:
    if isa not in gguf_q8.isas():  # WORKBENCH_GGUF_ISA=avx2 (make test-portable): that one
        pytest.skip(f"the {isa} q8 kernels are not this process's (flags, or forced ISA)")


# -- a NumPy port of llama.cpp's x86 quantizers ----------------------------------------------

def np_q8_0(x: np.ndarray, with_sum: bool = False) -> np.ndarray:
    """Rows float32 [M, K] -> Q8_0 (or Q8_1) blocks as bytes [M, K / 32 * 34 (36)]."""
    m = x.shape[0]
    b = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(b).max(axis=1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(b * inv[:, None]), -128, 127).astype(np.int8)
    parts = [d.astype(np.float16).view(np.uint8).reshape(-1, 2)]
    if with_sum:
        s = d * q.astype(np.int32).sum(axis=1).astype(np.float32)
        parts.append(s.astype(np.float16).view(np.uint8).reshape(-1, 2))
    parts.append(q.view(np.uint8))
    return np.concatenate(parts, axis=1).reshape(m, -1)


def np_q8_k(x: np.ndarray) -> np.ndarray:
    """Rows float32 [M, K] -> Q8_K blocks as bytes [M, K / 256 * 292]."""
    m = x.shape[0]
    b = x.reshape(-1, 256).astype(np.float32)
    first = np.abs(b).argmax(axis=1)  # the first of the largest |x|
    mx = b[np.arange(b.shape[0]), first]
    zero = mx == 0
    iscale = np.float32(-127) / np.where(zero, np.float32(1), mx)
    q = np.minimum(127, np.rint(iscale[:, None] * b)).astype(np.int8)
    q[zero] = 0
    bsums = q.astype(np.int32).reshape(-1, 16, 16).sum(axis=2).astype(np.int16)
    d = np.where(zero, np.float32(0), np.float32(1) / iscale).astype(np.float32)
    return np.concatenate([d.view(np.uint8).reshape(-1, 4), q.view(np.uint8),
                           bsums.view(np.uint8).reshape(-1, 32)], axis=1).reshape(m, -1)


def np_quantize(x: np.ndarray, kind: str) -> np.ndarray:
    return np_q8_k(x) if kind == "Q8_K" else np_q8_0(x, with_sum=kind == "Q8_1")


def hard_rows(size: int) -> np.ndarray:
    """Blocks that catch a quantizer's edges: ties (x * 127 / amax exactly k + 1/2) in both
    signs, an all-zero block, the largest |x| in every lane (either sign, twice in a block),
    scales whose fp16 d is subnormal or zero, huge values, one nonzero value."""
    rng = np.random.default_rng(0)
    rows = []
    ties = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5], dtype=np.float32)
    for sign in (1, -1):  # amax 127: the multiplier is exactly 1 (Q8_K: iscale -+1)
        row = np.resize(ties, size).astype(np.float32)
        row[3] = sign * 127
        rows.append(row)
    rows.append(np.zeros(size, dtype=np.float32))
    for lane in range(0, size, max(1, size // 32)):
        row = rng.standard_normal(size).astype(np.float32)
        row[lane] = (-1) ** lane * 9.0
        rows.append(row)
    twice = rng.standard_normal(size).astype(np.float32)
    twice[[5, 17]] = [-4.0, 4.0]  # the first of two largest |x| is the signed max (Q8_K)
    rows.append(twice)
    for scale in (1e-3, 1e-6, 1e-9, 3e4):  # fp16 d subnormal (1e-3), zero (1e-6, 1e-9)
        rows.append((rng.standard_normal(size) * scale).astype(np.float32))
    one = np.zeros(size, dtype=np.float32)
    one[7] = -0.3
    rows.append(one)
    return np.stack(rows)


@pytest.mark.parametrize("kind", ["Q8_0", "Q8_1", "Q8_K"])
def test_quantizers_are_llamacpps_byte_for_byte(kind):
    size = gguf_q8.ACTIVATION_BLOCKS[kind][0]
    rng = np.random.default_rng(1)
    x = np.concatenate([hard_rows(size * 2).reshape(-1, size * 2),
                        rng.standard_normal((9, size * 2)).astype(np.float32) * 3])
    got = gguf_q8.quantize(torch.from_numpy(x), kind).numpy()
    want = np_quantize(x, kind)
    assert got.shape == want.shape
    bad = np.argwhere(got != want)
    assert not len(bad), f"first differing byte (row, byte): {bad[:3].tolist()}"


def test_the_hard_rows_hit_ties_and_subnormal_scales():
    """The edges are really there: ties rounded to even (not away from zero, as the scalar
    reference's roundf would), a subnormal fp16 d."""
    x = torch.from_numpy(hard_rows(32))
    q = gguf_q8.quantize(x[:1], "Q8_0")[0, 2:].view(torch.int8)
    assert q[:3].tolist() == [0, 2, 2] and q[4:6].tolist() == [-2, -2]  # 0.5, 1.5, 2.5, ...
    d = gguf_q8.quantize(x, "Q8_0")[:, :2].contiguous().view(torch.float16).float()
    assert ((d > 0) & (d < 2 ** -14)).any()  # a subnormal half


def test_quantize_refuses_a_ragged_row():
    with pytest.raises(ValueError, match="multiple of 256"):
        gguf_q8.quantize(torch.zeros(1, 32), "Q8_K")


# -- the products --------------------------------------------------------------------------

def weight_and_input(kind: str, out: int, rows: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    k = BLOCK_TYPES[kind].block_size * (2 if kind.endswith("_K") else 9)
    weight = gguf_products.random_blocks(kind, out, k, gen)
    return weight, torch.randn(rows, k, generator=gen) * 2


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 17])
def test_product_is_the_integer_sums_times_the_scales(isa, kind, rows):
    runs(isa)
    weight, x = weight_and_input(kind, 45, rows, seed=rows)  # two groups of 16 and 13 after
    exact, magnitude = gguf_q8.exact_product(x, weight)
    got = gguf_q8.linear(x, weight, isa=isa).double()
    assert ((got - exact).abs() <= gguf_q8.error_bound(weight, magnitude)).all()


@pytest.mark.parametrize("kind", KINDS)
def test_the_exact_product_is_near_the_float_product(kind):
    """The reference is the model's product: within the activations' quantization error
    (half a step of 127 per block) of the float32 dequantized product."""
    weight, x = weight_and_input(kind, 13, 4)
    exact, _ = gguf_q8.exact_product(x, weight)
    dense = x.double() @ weight.dequantize().double().T
    assert ((exact - dense).norm() / dense.norm()) < 0.02


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_rows_bits_are_its_own_in_any_batch_and_thread_count(isa, kind):
    runs(isa)
    weight, x = weight_and_input(kind, 43, 19)
    bias = torch.randn(43)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([gguf_q8.linear(x[i:i + 1], weight, bias, isa=isa) for i in range(19)])
        torch.set_num_threads(2)
        batched = gguf_q8.linear(x, weight, bias, isa=isa)
        middle = gguf_q8.linear(x[3:14], weight, bias, isa=isa)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, batched) and torch.equal(middle, batched[3:14])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_weight_rows_bits_are_the_same_in_a_group_and_after_the_groups(isa, kind):
    """The rows after the last group of 16 go through the groups' arithmetic (interleaved into a
    group of their own): a row moved from a group to after them keeps its bits."""
    runs(isa)
    weight, x = weight_and_input(kind, 17, 5)
    last = weight.rows(16, 17)
    moved = QuantizedWeight(kind, 17, weight.in_features,
                            torch.cat([last.data, weight.data[1:16], weight.data[:1]]))
    out, out_moved = gguf_q8.linear(x, weight, isa=isa), gguf_q8.linear(x, moved, isa=isa)
    assert torch.equal(out[:, 16], out_moved[:, 0]) and torch.equal(out[:, 0], out_moved[:, 16])


@pytest.mark.parametrize("isa", ISAS)
def test_the_isas_agree_within_summation_order(isa):
    """Both ISAs sum the same integers: equal bits here (the same lanes and order)."""
    runs(isa)
    if not all(gguf_q8.available(i) for i in ISAS):
        pytest.skip("one ISA only on this CPU")
    for kind in KINDS:
        weight, x = weight_and_input(kind, 23, 3)
        assert torch.equal(gguf_q8.linear(x, weight, isa="avx2"),
                           gguf_q8.linear(x, weight, isa="avx512"))


@pytest.mark.parametrize("isa", ISAS)
def test_the_bound_catches_one_wrong_code(isa):
    """One weight code changed: the product leaves the bound (the test can fail)."""
    runs(isa)
    weight, x = weight_and_input("Q4_1", 21, 2)
    exact, magnitude = gguf_q8.exact_product(x, weight)
    weight.data[0, 4] ^= 0x0F  # row 0 (interleaved in a group): block 0's first code
    got = gguf_q8.linear(x, weight, isa=isa).double()
    assert not ((got - exact).abs() <= gguf_q8.error_bound(weight, magnitude)).all()


def test_the_isa_override(monkeypatch):
    monkeypatch.setenv(gguf_q8.ISA_ENV, "avx2")
    assert gguf_q8.isas() == ["avx2"]
    assert gguf_q8.linear_function("Q4_1") is c_library.library().wb_q8_linear_q4_1_avx2
    monkeypatch.setenv(gguf_q8.ISA_ENV, "sse2")
    with pytest.raises(ValueError, match="sse2"):
        gguf_q8.isas()


def test_partners_are_llamacpps():
    assert gguf_q8.PARTNER == {"Q4_0": "Q8_0", "Q8_0": "Q8_0", "Q4_1": "Q8_1",
                               "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K"}


@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump (binutils)")
def test_the_avx2_functions_hold_no_avx512_instruction():
    """No EVEX-encoded instruction (first byte 0x62) in the q8 AVX2 functions, the quantizers,
    or the OpenMP bodies outlined from them."""
    dump = subprocess.run(["objdump", "-d", c_library.library()._name], capture_output=True,
                          text=True, check=True).stdout
    evex, seen, name = [], set(), ""
    for line in dump.splitlines():
        if line.endswith(">:"):
            name = line.split("<", 1)[1][:-2]
        elif (name.startswith("wb_q8_linear_") and "_avx2" in name) or name.startswith(
                ("wb_quantize_q8", "wbq_pack", "wbq_q8")):
            seen.add(name.split(".")[0])
            if "\t62 " in line:
                evex.append((name, line))
    assert {gguf_q8.function_name(kind, "avx2") for kind in KINDS} <= seen
    assert not evex, evex[:3]
