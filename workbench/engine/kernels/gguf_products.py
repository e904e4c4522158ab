"""Products of float32 activations with GGUF blocks as the file holds them (`csrc/gguf.c`).

`linear(x, weight)` multiplies x [..., K] by a `QuantizedWeight` [N, K] (Q4_0, Q4_1, Q8_0,
Q4_K, Q5_K, Q6_K) without a dequantized copy: the C functions dequantize each group of 32
weights in registers into exactly `weight.dequantize()`'s float32 values and sum in float32, so
the result is the float32 dequantized product up to summation order (and the same bits for any
row count and thread count). Two instruction sets: "avx512" (AVX-512F with F16C) and "avx2"
(AVX2 with FMA); `isas()` lists those this CPU runs, best first, as `cpu_features()` reports
it. `WORKBENCH_GGUF_ISA=avx2` forces one (so the AVX2 functions are tested on an AVX-512 CPU).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import torch

from workbench.engine.kernels import c_library, c_products
from workbench.models.cpu import cpu_features
from workbench.models.gguf_blocks import BLOCK_TYPES, QuantizedWeight

ISAS = ("avx512", "avx2")  # best first
_FLAGS = {"avx512": ("avx512f", "f16c"), "avx2": ("avx2", "fma")}
ISA_ENV = "WORKBENCH_GGUF_ISA"


def function_name(kind: str, isa: str) -> str:
    """The C function of a block type (`"Q4_1"`) and an ISA: `wb_linear_q4_1_avx512`."""
    return f"wb_linear_{kind.lower()}_{isa}"


@functools.cache
def available(isa: str) -> bool:
    """Whether this CPU has the ISA's flags (probed first: the functions would fault without
    them), the library built, and its functions compute a known product of every block type."""
    if isa not in _FLAGS:
        raise ValueError(f"GGUF kernel ISA must be one of {list(ISAS)}, got {isa!r}")
    if not cpu_features().has(*_FLAGS[isa]) or c_library.library() is None:
        return False
    return all(_known_product_holds(kind, isa) for kind in BLOCK_TYPES)


def isas() -> list[str]:
    """The ISAs this CPU runs, best first; only `$WORKBENCH_GGUF_ISA` where it is set (an ISA
    this CPU cannot run is an error, never a silent fallback)."""
    return runnable_isas(available, "GGUF kernels")


def runnable_isas(available: Callable[[str], bool], what: str) -> list[str]:
    """`ISAS` that `available` says this CPU runs, best first, or the one `$WORKBENCH_GGUF_ISA`
    forces (refused, naming `what`, where it cannot run): both GGUF arithmetics' choice."""
    forced = os.environ.get(ISA_ENV)
    if forced:
        if not available(forced):
            raise RuntimeError(f"{ISA_ENV}={forced}: this CPU or its library cannot run the "
                               f"{forced} {what}")
        return [forced]
    return [isa for isa in ISAS if available(isa)]


def linear_function(kind: str, isa: str | None = None):
    """The C product function (ctypes) for block type `kind` on `isa` (default: the best of
    `isas()`), linear_f32.c's `wb_linear_f32` signature (a `wb_decode_stack` product function)."""
    if kind not in BLOCK_TYPES:
        raise ValueError(f"GGUF block type must be one of {sorted(BLOCK_TYPES)}, got {kind!r}")
    if isa is None:
        runnable = isas()
        if not runnable:
            raise RuntimeError("no GGUF kernel runs here: it needs AVX2 and FMA, and a C "
                               "compiler to build the kernels")
        isa = runnable[0]
    elif not available(isa):
        raise RuntimeError(f"the {isa} GGUF kernels do not run here")
    return getattr(c_library.library(), function_name(kind, isa))


def linear(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None,
           isa: str | None = None) -> torch.Tensor:
    """`x @ weight.dequantize().T (+ bias)` up to summation order: x float32 [..., K], bias
    float32 [N] -> float32 [..., N]."""
    n, k = weight.shape
    if x.dtype != torch.float32 or x.shape[-1] != k:
        raise ValueError(f"x must be float32 [..., {k}], got {x.dtype} {tuple(x.shape)}")
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (n,)):
        raise ValueError(f"bias must be float32 [{n}], got {bias.dtype} {tuple(bias.shape)}")
    if weight.data.dtype != torch.uint8 or not weight.data.is_contiguous():
        raise ValueError("the weight's data must be contiguous uint8")
    fn = linear_function(weight.kind, isa)
    return c_products.product(fn, x, weight.data, None if bias is None else bias.contiguous(),
                        out_features=n)


def _known_product_holds(kind: str, isa: str) -> bool:
    """Whether the `kind` function on `isa` computes a product of random blocks (3 rows, 5
    outputs, a bias) within float32 summation error of the dequantized product."""
    block = BLOCK_TYPES[kind]
    gen = torch.Generator().manual_seed(0)
    weight = random_blocks(kind, 5, block.block_size * 2, gen)
    x, b = torch.randn(3, weight.in_features, generator=gen), torch.randn(5, generator=gen)
    dense = weight.dequantize().double()
    expected = x.double() @ dense.T + b.double()
    got = c_products.product(getattr(c_library.library(), function_name(kind, isa)), x, weight.data, b,
                       out_features=5)
    bound = 1e-5 * ((x.double().abs() @ dense.abs().T) + b.double().abs())
    return bool(((got.double() - expected).abs() <= bound).all())


def random_blocks(kind: str, n: int, k: int, gen: torch.Generator) -> QuantizedWeight:
    """A weight [n, k] of random blocks of `kind` with sane f16 scales (normal, |d| in
    [2^-10, 2^-4)): random bytes for the codes, scales set where GGML keeps them."""
    block = BLOCK_TYPES[kind]
    data = torch.randint(0, 256, (n * (k // block.block_size), block.block_bytes),
                         dtype=torch.uint8, generator=gen)

    def halves(count: int) -> torch.Tensor:  # [B, 2 count] bytes of random f16 scales
        size = torch.rand(data.shape[0], count, generator=gen) * 6 - 10
        sign = torch.randint(0, 2, (data.shape[0], count), generator=gen) * 2 - 1
        return (sign * torch.exp2(size)).half().view(torch.uint8)

    at = {"Q4_0": (0, 1), "Q4_1": (0, 2), "Q8_0": (0, 1), "Q4_K": (0, 2), "Q5_K": (0, 2),
          "Q6_K": (208, 1)}[kind]
    data[:, at[0]:at[0] + 2 * at[1]] = halves(at[1])
    return QuantizedWeight(kind, n, k, data.reshape(n, -1))
