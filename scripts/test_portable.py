"""`make test-portable`: the engine tests on every kernel path this CPU can run, not only the one
`auto` picks here, then with torch, oneDNN and MKL limited to AVX2 (so an AVX-512 or AMX
machine also runs the AVX2 machines' paths), then, where qemu-user is installed, a share of them
on an AVX2-only CPU as the process sees it. Kernels are forced through `WORKBENCH_KERNEL`, which
applies to the models of the dtype each kernel computes in (`workbench/engine/kernels/projections.py`).

The limits steer the libraries' choices but leave the instructions there: an AVX-512 instruction
that slipped into an AVX2 path would still run. Under `qemu-x86_64 -cpu Haswell...` the CPUID
the process reads has AVX2, FMA and F16C and nothing above, so torch, oneDNN, MKL and the C
kernels choose as on such a machine, and any instruction beyond them stops the run (SIGILL). Both
AVX2 runs force the GGUF block products' AVX2 functions (`WORKBENCH_GGUF_ISA=avx2`). qemu-user
shows the host's /proc/cpuinfo, so the probe is narrowed to the same flags (`WORKBENCH_CPU_FLAGS`).
Emulation is ~20-50x slower: that run takes the kernel tests and the C ops' tests that are not
marked slow, minus the two longest (the same paths run natively in the AVX2-limited run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

import torch

from workbench.engine.kernels import projections
from workbench.models.cpu import cpu_features

TESTS = ["tests/engine", "tests/lora"]
# A Haswell without the system features TCG does not model (each would print a warning)
QEMU_CPU = "Haswell-noTSX,-pcid,-x2apic,-tsc-deadline,-invpcid"
QEMU_FLAGS = "avx2 fma f16c"
AVX2_GGUF = {"WORKBENCH_GGUF_ISA": "avx2"}  # the GGUF block products' AVX2 functions, forced
QEMU_TESTS = ["-m", "not slow", "tests/engine/kernels/test_kernels.py", "tests/engine/kernels/test_c_ops.py",
              "tests/engine/kernels/test_gguf_kernels.py", "tests/engine/kernels/test_gguf_q8.py",
              "-k", "not the_same_tokens_with_c_and_torch_ops and not float32-5"]


# Native runs in two processes, as `make test` (a test file to each at a time, OpenMP's idle
# threads asleep); never under qemu-user, which would start the workers outside the emulator
WORKERS = ["-n", "2", "--dist", "loadfile"]
WORKERS_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


@dataclass
class Run:
    title: str
    env: dict[str, str]
    prefix: list[str] = field(default_factory=list)  # what runs python (an emulator)
    tests: list[str] = field(default_factory=lambda: list(TESTS))

    def command(self) -> list[str]:
        workers = [] if self.prefix else WORKERS
        return [*self.prefix, sys.executable, "-m", "pytest", "-q", *workers, *self.tests]

    def environ(self) -> dict[str, str]:
        return {**os.environ, **({} if self.prefix else WORKERS_ENV), **self.env}


def runs() -> list[Run]:
    """The runs beyond `make test`'s."""
    features = cpu_features()

    def covered(kernel: str) -> bool:  # `make test` runs it: auto picks it for its dtype
        dtype = projections.DTYPE_OF.get(kernel, torch.float32)  # "torch": most tests are float32
        return projections.choose(dtype, "cpu", features=features).kernel == kernel

    out = [Run(f"kernel {k}", {"WORKBENCH_KERNEL": k}) for k in projections.KERNELS
           if not covered(k) and any(projections.missing(k, d, features) is None
                                     for d in (torch.float32, torch.bfloat16))]
    if not features.above_avx2:
        print("this CPU has nothing above AVX2: its `make test` run is the AVX2-limited run")
        return out
    out.append(Run("torch, oneDNN and MKL limited to AVX2",
                   {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                    "MKL_ENABLE_INSTRUCTIONS": "AVX2", **AVX2_GGUF}))
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        print("no qemu-x86_64 (Debian's qemu-user): the AVX2-only CPU run is left out")
    else:
        out.append(Run("an AVX2-only CPU (qemu-user)",
                       {"WORKBENCH_CPU_FLAGS": QEMU_FLAGS, **AVX2_GGUF},
                       [qemu, "-cpu", QEMU_CPU], QEMU_TESTS))
    return out


def main() -> int:
    failed = []
    for run in runs():
        shown = " ".join([*(f"{k}={v}" for k, v in run.env.items()), *run.prefix])
        print(f"== engine tests, {run.title}: {shown}", flush=True)
        if subprocess.call(run.command(), env=run.environ()):
            failed.append(run.title)
    print("portable runs failed: " + ", ".join(failed) if failed else "portable runs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
