"""Few-row products in C: float32 (AVX2, AVX-512F), bfloat16 (AVX-512 BF16) and AMX tiles.

`linear(x, w, b)` (float32, the "avx2" kernel; its AVX-512F function where the CPU has it),
`linear_bf16(x, w, b)` (bfloat16, the "avx512bf16" kernel) and the AMX products on `amx_pack`ed
weights call the C library (`c_library`) through ctypes on the tensors' memory. Nothing here is
used unless the kernel choice (`projections.py`) picked it, which needs the CPU's AVX2 and FMA
(`available()`), AVX-512 BF16 (`available_bf16()`) or AMX (`available_amx()`), and a library that
built and computed a known product correctly.

The batch-invariant engine's products (`linear_invariant_function()`, and the bfloat16
products themselves) give a row's sums one order whatever the other rows: a row's output is
the same bits for any row count, position among the rows and thread count, in one call for any
count.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from workbench.engine.kernels import c_library
from workbench.models.cpu import cpu_features

logger = logging.getLogger(__name__)


@functools.cache
def available() -> bool:
    """Whether the library built and computes a known product within float32 rounding."""
    lib = c_library.library()
    return lib is not None and all(_known_product_holds(fn) for fn in (
        lib.wb_linear_f32, lib.wb_linear_f32_invariant)) and _known_product_holds(
        lib.wb_linear_f32_w16, pack=lambda w: w.bfloat16(), widened=True)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """`x @ weight.T (+ bias)` for float32 CPU tensors, x [..., K], a contiguous weight [N, K]
    and bias [N] (the caller checks dtypes and layout: the C function reads raw memory)."""
    return product(linear_function(), x, weight, bias)


def product(fn, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            out_features: int | None = None) -> torch.Tensor:
    """`x @ weight.T (+ bias)` through the product function `fn` (`linear_function()`,
    `linear_bf16_function()`, or `linear_amx_function()` with an `amx_pack`ed weight and its
    `out_features`), out in x's dtype."""
    x = x.contiguous()
    k, n = x.shape[-1], out_features or weight.shape[0]
    m = x.numel() // k
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype)
    if m:
        fn(x.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(),
           out.data_ptr(), m, n, k, torch.get_num_threads())
    return out


@functools.cache
def linear_function():
    """The float32 products: the AVX-512F function where the CPU has it, else AVX2's."""
    lib = c_library.library()
    return lib.wb_linear_f32_avx512 if available_avx512() else lib.wb_linear_f32


@functools.cache
def linear_invariant_function():
    """The batch-invariant float32 products (`csrc/linear_f32.c`'s broadcast tiles for any row
    count; AVX2's takes one to six rows with eight weight rows in the lanes, the same sums): the
    AVX-512F function where the CPU has it, else AVX2's, the same bits."""
    lib = c_library.library()
    return lib.wb_linear_f32_invariant_avx512 if available_avx512() else \
        lib.wb_linear_f32_invariant


def linear_w16_function():
    """The float32 products on a bfloat16 weight (`csrc/linear_f32.c`'s `wb_linear_f32_w16`,
    AVX2): every row count, the invariant products' bits on the weight widened."""
    return c_library.function("wb_linear_f32_w16")


def invariant_linear() -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None],
                                  torch.Tensor] | None:
    """`linear(x, weight, bias)` through the batch-invariant float32 products, for an SAE's
    encoder (`SparseAutoencoder.encode(x, linear=...)`): a row's features the same bits whatever
    rows share the call, the weights read once for all of them (torch's matmul took 8 ms for 16
    rows of a 16k SAE where this takes 1.9); None where the C library does not run (torch's)."""
    if not available():
        return None
    function = linear_invariant_function()
    return lambda x, weight, bias: product(function, x, weight, bias, weight.shape[0])


@functools.cache
def _c(name: str):
    """The library's function `name` (called only once its kernel or ops were chosen)."""
    return getattr(c_library.library(), name)


@functools.cache
def available_avx512() -> bool:
    """Whether this CPU has AVX-512F (probed first: the function would fault without it) and
    the library's AVX-512 products compute a known product within float32 rounding."""
    lib = c_library.library()
    if not cpu_features().has("avx512f") or lib is None:
        return False
    return all(_known_product_holds(fn) for fn in (lib.wb_linear_f32_avx512,
                                                   lib.wb_linear_f32_invariant_avx512))


def _known_product_holds(fn, dtype: torch.dtype = torch.float32, rows: int = 5,
                         pack=None, widened: bool = False) -> bool:
    """Whether the product function `fn` computes a known product (rows x 45 by 19 x 45, a
    bias; the weight through `pack` when its layout is another, `widened`: a weight whose
    values are bfloat16's) within one rounding of dtype."""
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(rows, 45, generator=gen).to(dtype),
               torch.randn(19, 45, generator=gen).to(dtype),
               torch.randn(19, generator=gen).to(dtype))
    if widened:
        w = w.bfloat16().to(dtype)
    expected = x.double() @ w.double().T + b.double()
    got = product(fn, x, w if pack is None else pack(w), b, out_features=19)
    tol = (1e-5, 1e-5) if dtype == torch.float32 else (2 ** -7, 1e-2)
    return torch.allclose(got.double(), expected, rtol=tol[0], atol=tol[1])


@functools.cache
def available_bf16() -> bool:
    """Whether this CPU has AVX-512 BF16 (probed first: the function would fault without it)
    and the library built it and computes a known product within one bf16 rounding."""
    if not cpu_features().has("avx512f", "avx512bw", "avx512_bf16"):
        return False
    lib = c_library.library()
    if lib is None or getattr(lib, "wb_linear_bf16", None) is None:
        return False
    return _known_product_holds(lib.wb_linear_bf16, torch.bfloat16, rows=3)


def linear_bf16(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                ) -> torch.Tensor:
    """`x @ weight.T (+ bias)` for bfloat16 CPU tensors, x [..., K], a contiguous weight [N, K]
    and bias [N]: float32 sums rounded once (the caller checks dtypes and layout)."""
    return product(linear_bf16_function(), x, weight, bias)


def linear_bf16_function():
    """The bfloat16 products (AVX-512 BF16), any row count, batch-invariant by construction."""
    return c_library.function("wb_linear_bf16")


@functools.cache
def available_amx() -> bool:
    """Whether this CPU has AMX BF16 (probed first: the function would fault without it), the
    library built the AMX products (GCC 11, clang 12), the OS grants this process AMX's tile
    state, and the products compute a known product within one bf16 rounding."""
    if not cpu_features().has("amx_tile", "amx_bf16"):
        return False
    lib = c_library.library()
    if lib is None or getattr(lib, "wb_linear_bf16_amx", None) is None:
        return False
    if lib.wb_amx_enable() != 0:
        logger.warning("the OS refused this process AMX's tile state: the amx kernel is off")
        return False
    return _known_product_holds(lib.wb_linear_bf16_amx, torch.bfloat16, rows=17, pack=amx_pack)


def amx_pack(weight: torch.Tensor) -> torch.Tensor:
    """A bfloat16 weight [N, K] in the AMX products' tile layout (zero padded to whole tiles),
    the weight `linear_amx_function()` reads."""
    n, k = weight.shape
    packed = torch.empty(-(-n // 16) * 16 * (-(-k // 32) * 32), dtype=torch.bfloat16)
    c_library.function("wb_amx_pack")(weight.contiguous().data_ptr(), packed.data_ptr(), n, k)
    return packed


def linear_amx_function():
    """The bfloat16 products on AMX (on `amx_pack`ed weights)."""
    return c_library.function("wb_linear_bf16_amx")
