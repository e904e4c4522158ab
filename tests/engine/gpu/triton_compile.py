"""Compiles the Triton kernels for a CUDA GPU on a machine without one (`python -m
tests.engine.gpu.triton_compile [sm]`, sm 90 by default): Triton's own compiler and the ptxas it
ships, from Python down to a cubin. The interpreter tests (`test_triton_kernels.py`) check what
the kernels compute; this checks what only the GPU compiler sees (loop-carried types, the
products' shapes and precisions, constexpr branches). Each launch is the one the public
functions make for small CPU tensors, recorded instead of run. Not under TRITON_INTERPRET.
"""

from __future__ import annotations

import os
import sys

import torch
import triton
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource

from workbench.engine.gpu.triton import attention, ops


def launches() -> list[tuple]:
    """(kernel, args, kwargs) of every launch the public functions make for a few shapes and
    each dtype (the kernels' `run` recorded instead of called)."""
    recorded: list[tuple] = []
    kernels = (attention._paged_attention_kernel, ops._add_rms_norm_kernel,
               ops._rope_write_kv_kernel, ops._silu_mul_kernel)
    for kernel in kernels:
        kernel.run = (lambda *args, grid, warmup, _kernel=kernel, **kwargs:
                      recorded.append((_kernel, args, kwargs)))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for heads, kv_heads, head_dim, window, softcap in ((4, 4, 64, None, None),
                                                           (6, 2, 80, 7, 30.0)):
            q = torch.zeros(5, heads, head_dim, dtype=dtype)
            cache = torch.zeros(64, kv_heads, head_dim, dtype=dtype)
            attention.paged_attention(q, cache, cache, torch.zeros(2, 4, dtype=torch.int32),
                                      torch.tensor([0, 1, 5], dtype=torch.int32),
                                      torch.tensor([9, 12], dtype=torch.int32), 16, 0.125,
                                      window, softcap)
        # ones, which a launch specializes as constants: one sequence, one block, one KV head
        q, cache = torch.zeros(1, 3, 48, dtype=dtype), torch.zeros(16, 1, 48, dtype=dtype)
        attention.paged_attention(q, cache, cache, torch.zeros(1, 1, dtype=torch.int64),
                                  torch.tensor([0, 1]), torch.tensor([1]), 16, 0.125, 1)
        hidden = torch.zeros(3, 96, dtype=dtype)
        ops.add_rms_norm(hidden, hidden, torch.ones(96, dtype=dtype), 1e-6)
        ops.add_rms_norm(hidden, None, torch.ones(96, dtype=dtype), 1e-6)
        ops.add_rms_norm(hidden[:1, :1], None, torch.ones(1, dtype=dtype), 1e-6)
        for heads, kv_heads in ((4, 2), (1, 1)):
            cache = torch.zeros(8, kv_heads, 64, dtype=dtype)
            ops.rope_write_kv(torch.zeros(3, (heads + 2 * kv_heads) * 64, dtype=dtype),
                              torch.zeros(3, 64, dtype=dtype), torch.zeros(3, 64, dtype=dtype),
                              torch.zeros(3, dtype=torch.long), cache, cache, heads, kv_heads)
        ops.silu_mul(torch.zeros(3, 2 * 96, dtype=dtype))
        ops.silu_mul(torch.zeros(1, 2, dtype=dtype))
    return recorded


def compile_all(sm: int = 90) -> int:
    """Compiles every recorded launch for CUDA `sm` -> how many."""
    target = GPUTarget("cuda", sm, 32)
    count = 0
    for kernel, args, kwargs in launches():
        names = kernel.arg_names
        constants = {name: value for name, value in kwargs.items() if name in names}
        options = {name: value for name, value in kwargs.items() if name not in names}
        signature = {}
        for name, arg in zip(names, args):  # as a launch specializes them: 1 is a constant
            kind, key = native_specialize_impl(BaseBackend, arg, False, True, True)
            signature[name] = kind
            if kind == "constexpr":
                constants[name] = key
        signature.update({name: "constexpr" for name in constants})
        compiled = triton.compile(ASTSource(kernel, signature, constants), target=target,
                                  options=options)  # the launch's own (enable_fp_fusion)
        if not compiled.asm.get("cubin"):
            raise RuntimeError(f"{kernel.__name__}: no cubin for sm_{sm}")
        count += 1
    return count


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "") not in ("", "0"):
        sys.exit("unset TRITON_INTERPRET: this compiles the kernels, the interpreter runs them")
    sm = int(sys.argv[1]) if len(sys.argv) > 1 else 90
    print(f"{compile_all(sm)} launches compiled for sm_{sm}")
