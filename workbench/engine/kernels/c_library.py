"""The C library: the kernels' sources in `csrc/`, compiled once per machine and loaded.

The C sources ship beside this module in `csrc/`, one file per kind of kernel: `linear_f32.c`,
`linear_bf16.c`, `linear_amx.c`, `gguf.c`, `gguf_q8.c` (the products), `linear_parts.c` (a
projection of parts in different layouts), `attention.c`, `layer_ops.c` (norms, rotary, SiLU),
`decode_stack.c` (a decode step through every layer in one call), `wb.h` (what they share).
`library()` compiles them with the system's C compiler (`$CC`, else `cc`/`gcc`) into one
library in the workbench cache (`$WORKBENCH_CACHE/kernels/`), named by a hash of the
sources, the flags and the compiler, so a change of any of them builds a new one; the build
takes about ten seconds (most of it `gguf.c`'s functions, one per block type and ISA) and
happens at most once per machine (`make install` does it ahead). `function(name)` is one of its
functions with its ctypes signature; the modules beside this one (`c_products`, `c_attention`,
`c_layer_ops`, `c_decode_stack`, `gguf_products`, `gguf_q8`) call them on the tensors' memory.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from workbench.models.cache import cache_dir
from workbench.models.gguf_blocks import BLOCK_TYPES

logger = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
# no contraction of a * b + c into one rounding: the C code rounds where it says (fused
# multiply-adds are written as intrinsics where they are meant)
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", "-lm")


def compiler() -> str | None:
    """The C compiler to build with: `$CC`, else `cc` or `gcc` on the PATH, else None."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def sources() -> list[Path]:
    """The C files compiled into the library, and the header they share."""
    return sorted(CSRC.glob("*.c")) + [CSRC / "wb.h"]


def library_path(cc: str) -> Path:
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sources())
                            + " ".join((cc, *FLAGS)).encode()).hexdigest()
    return cache_dir() / "kernels" / f"gemv-{digest[:16]}.so"


def build(cc: str) -> Path:
    """Compiles the C sources into the cache (atomically: a crash leaves no half-written library)."""
    path = library_path(cc)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        subprocess.run([cc, *FLAGS, *(str(p) for p in sources() if p.suffix == ".c"), "-o",
                        str(out)], check=True,
                       capture_output=True, text=True, timeout=120)
        os.replace(out, path)
    logger.info("built the avx2 kernel: %s", path)
    return path


_P, _I64, _INT, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {  # the C functions: arguments, result
    "wb_linear_f32": ([_P] * 4 + [_I64] * 3 + [_INT], None),
    "wb_linear_f32_avx512": ([_P] * 4 + [_I64] * 3 + [_INT], None),
    "wb_linear_f32_invariant": ([_P] * 4 + [_I64] * 3 + [_INT], None),
    "wb_linear_f32_w16": ([_P] * 4 + [_I64] * 3 + [_INT], None),
    "wb_linear_f32_invariant_avx512": ([_P] * 4 + [_I64] * 3 + [_INT], None),
    "wb_linear_bf16": ([_P] * 4 + [_I64] * 3 + [_INT], None),
    "wb_linear_bf16_amx": ([_P] * 4 + [_I64] * 3 + [_INT], None),
    "wb_amx_pack": ([_P, _P, _I64, _I64], None),
    "wb_amx_enable": ([], _INT),
    "wb_decode_attention": ([_P, _I64, _P, _P, _P, _I64, _P, _P] + [_I64] * 5
                            + [_F32, _INT, _INT], _INT),
    "wb_paged_attention": ([_P, _I64] + [_P] * 5 + [_I64, _F32, _P, _F32, _P] + [_I64] * 5
                           + [_F32, _INT, _INT], _INT),
    "wb_add_rms_norm": ([_P] * 5 + [_I64] * 2 + [_F32, _INT, _INT], _INT),
    "wb_rope_write_kv": ([_P, _I64] + [_P] * 6 + [_I64] * 4 + [_INT, _INT], _INT),
    "wb_silu_mul": ([_P] * 2 + [_I64] * 2 + [_INT, _INT], _INT),
    "wb_ranks_top_k": ([_P, _P] + [_I64] * 3 + [_P] * 3, _INT),
    "wb_entropy": ([_P, _I64, _I64, _P, _INT], _INT),
    "wb_linear_parts": ([_P] * 4 + [_I64] * 3 + [_INT], None),
    "wb_decode_stack": ([_P, _P, _I64] + [_P] * 6 + [_I64, _P] + [_I64] * 7
                        + [_F32, _INT, _INT], _INT),
    **{f"wb_linear_{kind.lower()}_{isa}": ([_P] * 4 + [_I64] * 3 + [_INT], None)  # csrc/gguf.c
       for kind in BLOCK_TYPES for isa in ("avx2", "avx512")},
    **{f"wb_q8_linear_{kind.lower()}_{isa}": ([_P] * 4 + [_I64] * 3 + [_INT], None)  # gguf_q8.c
       for kind in BLOCK_TYPES for isa in ("avx2", "avx512")},
    **{f"wb_quantize_{kind}": ([_P, _P, _I64, _I64], None) for kind in ("q8_0", "q8_1", "q8_k")},
}


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None (with the reason logged) when it cannot be."""
    cc = compiler()
    if cc is None:
        logger.warning("no C compiler (set CC, or install gcc): the C kernels (avx2, "
                       "avx512bf16) and ops are unavailable")
        return None
    try:
        lib = ctypes.CDLL(str(build(cc)))  # after torch: OpenMP resolves to the runtime it loaded
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", "") or error
        logger.warning("the C kernels did not build with %s: %s", cc, detail)
        return None
    for name, (args, result) in _SIGNATURES.items():
        fn = getattr(lib, name, None)  # wb_linear_bf16: absent if the compiler predates the ISA
        if fn is not None:
            fn.argtypes, fn.restype = args, result
    return lib


@functools.cache
def function(name: str):
    """The library's function `name` (called only once its kernel or ops were chosen)."""
    return getattr(library(), name)
