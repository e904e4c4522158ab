"""Which torch dtype and device a model runs in, from the names users type.

`resolve_device("auto")` picks CUDA when torch sees a GPU, else the CPU. `resolve_dtype("auto")`
picks bfloat16 where the hardware computes it natively (a CUDA GPU that supports it, or a CPU
with the AVX-512 BF16 or AMX BF16 instructions), else float32. Explicit names and torch dtypes
pass through; anything else raises `ValidationError` naming the parameter.
"""

from __future__ import annotations

from pathlib import Path

import torch

from workbench.errors import ValidationError
from workbench.models.cpu import cpu_features, probe

DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}


def cpu_supports_bf16(cpuinfo: str | Path | None = None) -> bool:
    """Whether the CPU has native bf16 instructions (AVX-512 BF16 or AMX BF16), from the probe in
    `workbench.models.cpu` (this process's, or that of a given /proc/cpuinfo file)."""
    return (cpu_features() if cpuinfo is None else probe(cpuinfo, env={})).native_bf16


def resolve_device(device: str | torch.device = "auto") -> str:
    """"auto" -> "cuda" when torch sees a GPU, else "cpu"; "cpu", "cuda", "cuda:N" pass through.

    >>> resolve_device("cpu")
    'cpu'
    """
    name = str(device)
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return name
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if not torch.cuda.is_available():
            raise ValidationError(f"device {name!r} was asked for, but torch sees no CUDA GPU; "
                                  "use device='cpu' or 'auto'.", parameter="device", value=name)
        return name
    raise ValidationError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {name!r}.",
                          parameter="device", value=name)


def resolve_dtype(dtype: str | torch.dtype = "auto", device: str = "auto") -> torch.dtype:
    """A torch dtype from "auto", a name ("float32", "bf16", ...) or a torch dtype.

    >>> resolve_dtype("float32")
    torch.float32
    """
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPE_NAMES.values():
            raise ValidationError(f"dtype must be a floating dtype (float32, bfloat16, float16), "
                                  f"got {dtype}.", parameter="dtype", value=str(dtype))
        return dtype
    name = str(dtype).removeprefix("torch.")
    if name in DTYPE_NAMES:
        return DTYPE_NAMES[name]
    if name != "auto":
        raise ValidationError(f"dtype must be 'auto' or one of {sorted(set(DTYPE_NAMES))}, "
                              f"got {dtype!r}.", parameter="dtype", value=dtype)
    if resolve_device(device).startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_supports_bf16() else torch.float32
