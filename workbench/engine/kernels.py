"""Which kernel runs the model's projections: chosen once per process from the CPU's features.

| kernel       | dtype    | needs                                               | what it does
|--------------|----------|-----------------------------------------------------|-------------------------
| "avx2"       | float32  | AVX2 + FMA, a C compiler (`engine/gemv.py`)         | few-row products
|              |          |                                                     | (decoding, beams, small
|              |          |                                                     | batches) in C; prefill
|              |          |                                                     | chunks via `F.linear`
| "amx"        | bfloat16 | "onednn"'s needs + AMX BF16, a C compiler that      | products of up to
|              |          | targets it, the OS's grant of AMX state             | AMX_MAX_ROWS rows on
|              |          | (`engine/gemv.py`)                                  | AMX tiles in C; more
|              |          |                                                     | rows as "onednn"
| "avx512bf16" | bfloat16 | "onednn"'s needs + AVX-512 BF16, a C compiler       | products of up to
|              |          | (`engine/gemv.py`)                                  | four rows in C; more
|              |          |                                                     | rows as "onednn"
| "mkl"        | bfloat16 | "onednn"'s needs + AMX BF16, MKL's bf16 GEMM        | one-row products via
|              |          | exported by torch (`engine/mkl.py`)                 | MKL; more as "onednn"
| "onednn"     | bfloat16 | AVX-512 BW/VL/DQ or AVX-NE-CONVERT, oneDNN in torch | weights prepacked by
|              |          |                                                     | oneDNN
| "torch"      | any      | nothing                                             | `F.linear`
|
The small operators between the projections (`KernelChoice.ops`) run in C wherever the C
library is available and the kernel is not "torch" ("c"), in float32 and bfloat16: decode
attention reading the KV cache in place (`gemv.decode_attention`), each residual add with the
RMSNorm after it (`gemv.add_rms_norm`), rotary embedding with the KV write
(`gemv.rope_write_kv`) and SiLU gating (`gemv.silu_mul`). With "torch", or without the library,
they are torch's ops ("torch": SDPA over the gathered context, bit-identical to transformers'
layers).

`choose(dtype, device)` takes the first that this process can run, in the order above for its
dtype ("auto"), or checks the one asked for (`kernel=` / `--kernel`) and refuses it at start-up,
naming the flag and what the machine lacks. `$WORKBENCH_KERNEL` asks for a kernel where those
say "auto", for the models of the dtype it computes in (how `make test-portable` runs the
engine tests on each kernel). Every requirement is a probed capability (`workbench.models.cpu`,
a test product), never a CPU vendor. On CUDA the kernel is always "torch" (cuBLAS).
`python -m workbench.engine.kernels` prints what this machine has and picks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from workbench.engine import gemv, mkl
from workbench.errors import ValidationError
from workbench.models.cpu import CpuFeatures, cpu_features

KERNELS = ("avx2", "amx", "avx512bf16", "mkl", "onednn", "torch")
DTYPE_OF = {"avx2": torch.float32, "amx": torch.bfloat16, "avx512bf16": torch.bfloat16,
            "mkl": torch.bfloat16, "onednn": torch.bfloat16}  # torch: any
_AUTO_ORDER = {torch.float32: ("avx2", "torch"),
               torch.bfloat16: ("amx", "avx512bf16", "mkl", "onednn", "torch")}


@dataclass(frozen=True)
class KernelChoice:
    """The kernel a model's projections run on, and why (for the start-up log and the bench)."""

    kernel: str
    dtype: torch.dtype
    device: str
    cpu_flags: str  # the probed flags that matter here ("" on CUDA)
    ops: str = "torch"  # the small ops between the projections: "c" (gemv.c) or "torch"

    def describe(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        flags = f", cpu flags: {self.cpu_flags}" if self.cpu_flags else ""
        return f"kernel {self.kernel}, ops {self.ops} ({dtype} on {self.device}{flags})"


def missing(kernel: str, dtype: torch.dtype, features: CpuFeatures) -> str | None:
    """What this process lacks to run `kernel` on `dtype` (None: it can run it)."""
    if kernel == "torch":
        return None
    if kernel == "avx2":
        if dtype != torch.float32:
            return "it computes in float32 (use --dtype float32)"
        if not features.has("avx2", "fma"):
            return f"a CPU with AVX2 and FMA (this one has: {features.summary()})"
        if not gemv.available():
            return "a C compiler to build it (set CC or install gcc; the log says what failed)"
        return None
    if dtype != torch.bfloat16:
        return "it computes in bfloat16 (use --dtype bfloat16)"
    if not features.onednn_bf16:
        return ("a CPU with AVX-512 BW/VL/DQ or AVX-NE-CONVERT for oneDNN's bf16 products "
                f"(this one has: {features.summary()})")
    if not onednn_prepack_works():
        return "a torch build with oneDNN's prepacked linear weights"
    if kernel == "amx":
        if not features.has("amx_tile", "amx_bf16"):
            return f"a CPU with AMX BF16 (this one has: {features.summary()})"
        if not gemv.available_amx():
            return ("a C compiler that targets AMX (GCC 11 or clang 12 and later; set CC) and "
                    "an OS that grants processes AMX's tile state (Linux 5.16); the log says "
                    "what failed")
    if kernel == "avx512bf16":
        if not features.has("avx512f", "avx512bw", "avx512_bf16"):
            return f"a CPU with AVX-512 BF16 (this one has: {features.summary()})"
        if not gemv.available_bf16():
            return ("a C compiler that targets AVX-512 BF16 (GCC 10 or clang 9 and later; set "
                    "CC; the log says what failed)")
    if kernel == "mkl":
        if not features.has("amx_bf16"):
            return f"a CPU with AMX BF16 (this one has: {features.summary()})"
        if not mkl.available():
            return "a torch build that exports MKL's bf16 GEMM"
    return None


def onednn_prepack_works() -> bool:
    """Whether oneDNN's prepacked bf16 linear runs here (a build or ISA without it raises)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(2, 2, dtype=torch.bfloat16), 1)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 2, dtype=torch.bfloat16), packed, None,
                                           "none", [], "")
    except (AttributeError, RuntimeError):
        return False
    return True


def choose(dtype: torch.dtype, device: str = "cpu", requested: str = "auto",
           features: CpuFeatures | None = None) -> KernelChoice:
    """The kernel for `dtype` on `device` (see the module docstring); `ValidationError` naming
    `kernel` when the one asked for cannot run here."""
    if requested == "auto":
        forced = os.environ.get("WORKBENCH_KERNEL") or "auto"
        if DTYPE_OF.get(forced, dtype) == dtype:
            requested = forced
    if requested not in ("auto", *KERNELS):
        raise ValidationError(f"kernel must be 'auto' or one of {KERNELS}, got {requested!r}.",
                              parameter="kernel", value=requested)
    if not str(device).startswith("cpu"):
        if requested not in ("auto", "torch"):
            raise ValidationError(f"kernel {requested!r} (--kernel) runs on the CPU only; on "
                                  f"{device} the kernel is 'torch'.", parameter="kernel",
                                  value=requested)
        return KernelChoice("torch", dtype, str(device), "")
    features = cpu_features() if features is None else features
    if requested == "auto":
        kernel = next(k for k in _AUTO_ORDER.get(dtype, ("torch",))
                      if missing(k, dtype, features) is None)
    else:
        lack = missing(requested, dtype, features)
        if lack is not None:
            raise ValidationError(f"kernel {requested!r} (--kernel) cannot run here: it needs "
                                  f"{lack}.", parameter="kernel", value=requested)
        kernel = requested
    ops = "c" if kernel != "torch" and features.has("avx2", "fma") and gemv.available() \
        else "torch"
    return KernelChoice(kernel, dtype, "cpu", features.summary(), ops)


def emulated(dtype: torch.dtype, device: str = "cpu", features: CpuFeatures | None = None
             ) -> bool:
    """Whether `dtype` is bfloat16 on a CPU without native bf16 (slower than float32 there)."""
    features = cpu_features() if features is None else features
    return dtype == torch.bfloat16 and str(device).startswith("cpu") and not features.native_bf16


def runnable(dtype: torch.dtype, features: CpuFeatures | None = None) -> list[str]:
    """Every kernel this process can run for `dtype` on the CPU (what the portable tests force)."""
    features = cpu_features() if features is None else features
    return [k for k in KERNELS if missing(k, dtype, features) is None]


def main() -> None:
    """Prints this machine's probed flags, the kernel (and ops) `auto` picks per dtype, and
    every kernel it can run (one line each: `make test-portable` reads the last)."""
    features = cpu_features()
    limits = f" (limits: {', '.join(features.limits)})" if features.limits else ""
    print(f"cpu flags: {features.summary()}{limits}")
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        choice = choose(dtype, "cpu", features=features)
        print(f"{name}: auto picks {choice.kernel} (ops {choice.ops}); runnable: "
              f"{' '.join(runnable(dtype, features))}")
    print("runnable:", " ".join(k for k in KERNELS if any(
        missing(k, d, features) is None for d in (torch.float32, torch.bfloat16))))


if __name__ == "__main__":
    main()
