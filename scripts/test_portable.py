"""`make test-portable`: the engine tests on every kernel path this CPU can run, not only the one
`auto` picks here, then with torch, oneDNN and MKL limited to AVX2 (so an AVX-512 or AMX
machine also runs the AVX2 machines' paths). Kernels are forced through `WORKBENCH_KERNEL`, which applies to
the models of the dtype each kernel computes in (`workbench/engine/kernels.py`)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

from workbench.engine import kernels
from workbench.models.cpu import cpu_features

TESTS = ["tests/engine", "tests/lora"]


def runs() -> list[tuple[str, dict[str, str]]]:
    """(title, environment) of each run beyond `make test`'s."""
    features = cpu_features()

    def covered(kernel: str) -> bool:  # `make test` runs it: auto picks it for its dtype
        dtype = kernels.DTYPE_OF.get(kernel, torch.float32)  # "torch": most tests are float32
        return kernels.choose(dtype, "cpu", features=features).kernel == kernel

    out = [(f"kernel {k}", {"WORKBENCH_KERNEL": k}) for k in kernels.KERNELS
           if not covered(k) and any(kernels.missing(k, d, features) is None
                                     for d in (torch.float32, torch.bfloat16))]
    if any(flag.startswith(("avx512", "amx", "avx_vnni", "avx_ne_convert"))
           for flag in features.flags):
        out.append(("torch, oneDNN and MKL limited to AVX2",
                    {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                     "MKL_ENABLE_INSTRUCTIONS": "AVX2"}))
    else:
        print("this CPU has nothing above AVX2: its `make test` run is the AVX2-limited run")
    return out


def main() -> int:
    failed = []
    for title, env in runs():
        print(f"== engine tests, {title}: {' '.join(f'{k}={v}' for k, v in env.items())}",
              flush=True)
        code = subprocess.call([sys.executable, "-m", "pytest", "-q", *TESTS],
                               env={**os.environ, **env})
        if code:
            failed.append(title)
    print("portable runs failed: " + ", ".join(failed) if failed else "portable runs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
