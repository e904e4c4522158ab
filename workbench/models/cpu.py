"""What this CPU can run: its instruction-set flags, as the kernels and `dtype="auto"` need them.

Every choice that depends on the processor (the dtype `auto` picks, the projection kernel the
engine uses, which kernel tests run) reads `cpu_features()`, never a vendor or model name. The
flags come from Linux's /proc/cpuinfo, then are cut down to what torch and oneDNN are allowed to
use in this process, so the choices follow the documented limits:
- `ATEN_CPU_CAPABILITY=avx2` (torch's own kernels), `ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN's) and
  `MKL_ENABLE_INSTRUCTIONS=AVX2` (MKL's, torch's float32 BLAS) remove the AVX-512 and AMX flags,
  so an AVX-512 machine exercises the AVX2 code paths;
- `WORKBENCH_CPU_FLAGS="avx2 fma"` keeps only the flags it names, to simulate a smaller machine
  (it never adds a flag the CPU lacks: a kernel chosen for it would crash).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

# An ISA limit (torch's ATEN_CPU_CAPABILITY, oneDNN's ONEDNN_MAX_CPU_ISA, MKL's
# MKL_ENABLE_INSTRUCTIONS) -> the flag prefixes
# it rules out. Values not listed (avx512_core_amx, "avx512" for torch, ...) limit nothing here.
_ABOVE_AVX2 = ("avx512", "amx", "avx_vnni", "avx_ne_convert")
_LIMITS: dict[str, tuple[str, ...]] = {
    "default": ("avx2", "fma") + _ABOVE_AVX2, "sse41": ("avx2", "fma") + _ABOVE_AVX2,
    "avx": ("avx2", "fma") + _ABOVE_AVX2, "avx2": _ABOVE_AVX2,
    "avx2_vnni": ("avx512", "amx", "avx_ne_convert"), "avx2_vnni_2": ("avx512", "amx"),
    "avx512_core": ("avx512_bf16", "avx512_vnni", "amx"), "avx512_core_vnni": ("avx512_bf16", "amx"),
    "avx512_core_bf16": ("amx",),
}
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # native bf16 arithmetic
ONEDNN_BF16_FLAGS = (("avx512bw", "avx512vl", "avx512dq"), ("avx_ne_convert",))  # any one set
KNOWN_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
               "avx512_bf16", "avx512_vnni", "avx_vnni", "avx_ne_convert", "amx_tile", "amx_bf16",
               "amx_int8")


@dataclass(frozen=True)
class CpuFeatures:
    """The instruction-set flags kernels may use here (see the module docstring)."""

    flags: frozenset[str]
    source: str  # where they came from: "/proc/cpuinfo" (& "WORKBENCH_CPU_FLAGS"), or "none"
    limits: tuple[str, ...] = ()  # the environment limits applied, e.g. "ONEDNN_MAX_CPU_ISA=AVX2"

    def has(self, *flags: str) -> bool:
        return all(flag in self.flags for flag in flags)

    @property
    def native_bf16(self) -> bool:
        """bf16 arithmetic in hardware (AVX-512 BF16 or AMX): `dtype="auto"` picks bfloat16."""
        return any(flag in self.flags for flag in BF16_FLAGS)

    @property
    def above_avx2(self) -> bool:
        """Any flag beyond AVX2 (AVX-512, AMX, AVX-VNNI...): the AVX2 limits would cut something."""
        return any(flag.startswith(_ABOVE_AVX2) for flag in self.flags)

    @property
    def onednn_bf16(self) -> bool:
        """oneDNN's bf16 matrix products (its prepacked weights) need one of these sets."""
        return any(self.has(*group) for group in ONEDNN_BF16_FLAGS)

    def summary(self) -> str:
        """The flags that matter for kernels, space-separated (the start-up log, the bench)."""
        shown = [flag for flag in KNOWN_FLAGS if flag in self.flags]
        return " ".join(shown) or "(none)"


def parse_cpuinfo(text: str) -> frozenset[str]:
    """The `flags` of the first processor in a /proc/cpuinfo text."""
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[-1].split())
    return frozenset()


def probe(cpuinfo: str | Path = "/proc/cpuinfo", env: dict[str, str] | None = None
          ) -> CpuFeatures:
    """The features of `cpuinfo` under the limits in `env` (default: this process's)."""
    env = os.environ if env is None else env
    try:
        flags, source = parse_cpuinfo(Path(cpuinfo).read_text()), str(cpuinfo)
    except OSError:
        flags, source = frozenset(), "none"
    override = env.get("WORKBENCH_CPU_FLAGS")
    if override is not None:
        flags, source = flags & frozenset(override.replace(",", " ").split()), \
            f"{source} & WORKBENCH_CPU_FLAGS"
    limits = []
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
                 "MKL_ENABLE_INSTRUCTIONS"):
        value = env.get(name, "").strip().lower()
        if value in _LIMITS:
            limits.append(f"{name}={env[name]}")
            flags = frozenset(f for f in flags if not f.startswith(_LIMITS[value]))
    return CpuFeatures(flags, source, tuple(limits))


@functools.cache
def cpu_features() -> CpuFeatures:
    """This process's CPU features, probed once."""
    return probe()
