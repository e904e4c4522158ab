"""bfloat16 matrix products through MKL's `cblas_gemm_bf16bf16f32`, which torch's CPU build carries.

torch multiplies bfloat16 on the CPU with oneDNN. For the one-row products of single-stream
decoding, MKL's bf16 GEMM streams the weights faster on AMX machines (the README's Benchmark
section has the figures), with the same arithmetic: fp32 accumulation, one rounding to bf16 at
the end. torch exports the symbol from `libtorch_cpu.so` on x86-64 Linux builds; anywhere it is
missing, `available()` is False and nothing here is used. The kernel choice
(`engine/kernels.py`) uses it only on CPUs with AMX BF16, the kind it was measured on.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


@functools.cache
def _gemm():
    """The C function, or None when this torch build does not export it."""
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        fn = ctypes.CDLL(path).cblas_gemm_bf16bf16f32
    except (OSError, AttributeError):
        return None
    c_int, ptr = ctypes.c_int, ctypes.c_void_p
    fn.argtypes = [c_int, c_int, c_int, c_int, c_int, c_int, ctypes.c_float, ptr, c_int, ptr,
                   c_int, ctypes.c_float, ptr, c_int]
    fn.restype = None
    return fn


@functools.cache
def available() -> bool:
    """Whether the bf16 GEMM is there and computes a known product correctly (checked once)."""
    if _gemm() is None:
        return False
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 40, generator=gen).to(torch.bfloat16)
    w = torch.randn(24, 40, generator=gen).to(torch.bfloat16)
    expected = x.float() @ w.float().T
    return torch.allclose(linear(x, w), expected.to(torch.bfloat16), atol=0.05, rtol=0.02)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """`x @ weight.T (+ bias)` in bf16, for bf16 x [..., K] and a contiguous bf16 weight [N, K]
    (the caller checks the dtypes: the C function reads raw memory)."""
    if x.dim() == 2 and x.is_contiguous():  # the decoder's packed rows: no reshapes
        return _product(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    return _product(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])


def _product(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
             ) -> torch.Tensor:
    """`linear` on contiguous rows [M, K] -> [M, N] bf16."""
    m, k = rows.shape
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=torch.float32)
    if m:
        _gemm()(_ROW_MAJOR, _NO_TRANS, _TRANS, m, n, k, 1.0, rows.data_ptr(), k,
                weight.data_ptr(), k, 0.0, out.data_ptr(), n)
    if bias is not None:
        out += bias
    return out.to(torch.bfloat16)
