"""The C kernels (few-row products, the small ops between them), built per machine.

The C sources ship beside this module in `csrc/`, one file per kind of kernel: `linear_f32.c`,
`linear_bf16.c`, `linear_amx.c`, `gguf.c` (the products), `attention.c`, `layer_ops.c` (norms,
rotary, SiLU), `decode_stack.c` (a decode step through every layer in one call), `wb.h` (what
they share). `library()` compiles them with the system's C compiler (`$CC`, else `cc`/`gcc`)
into one library in the workbench cache (`$WORKBENCH_CACHE/kernels/`), named by a hash of the
sources, the flags and the compiler, so a change of any of them builds a new one; the build
takes about ten seconds (most of it `gguf.c`'s functions, one per block type and ISA) and
happens at most once per machine (`make install` does it ahead).
`linear(x, w, b)` (float32, the "avx2" kernel; its AVX-512F function where the CPU has it),
`linear_bf16(x, w, b)` (bfloat16, the "avx512bf16" kernel), `decode_attention`,
`add_rms_norm`, `rope_write_kv` and `silu_mul` (both dtypes, every kernel but "torch": the "c"
ops) call it through ctypes on the tensors' memory. Nothing here is used unless the kernel
choice (`engine/kernels.py`) picked it, which needs the CPU's AVX2 and FMA (`available()`), or
AVX-512 BF16 (`available_bf16()`), and a library that built and computed a known product
correctly.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from workbench.models.cache import cache_dir
from workbench.models.cpu import cpu_features
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
    "wb_decode_stack": ([_P, _P, _I64] + [_P] * 6 + [_I64, _P] + [_I64] * 7
                        + [_F32, _INT, _INT], _INT),
    **{f"wb_linear_{kind.lower()}_{isa}": ([_P] * 4 + [_I64] * 3 + [_INT], None)  # csrc/gguf.c
       for kind in BLOCK_TYPES for isa in ("avx2", "avx512")},
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
def available() -> bool:
    """Whether the library built and computes a known product within float32 rounding."""
    lib = library()
    return lib is not None and _known_product_holds(lib.wb_linear_f32)


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
    lib = library()
    return lib.wb_linear_f32_avx512 if available_avx512() else lib.wb_linear_f32


@functools.cache
def _c(name: str):
    """The library's function `name` (called only once its kernel or ops were chosen)."""
    return getattr(library(), name)


@functools.cache
def available_avx512() -> bool:
    """Whether this CPU has AVX-512F (probed first: the function would fault without it) and
    the library's AVX-512 products compute a known product within float32 rounding."""
    lib = library()
    if not cpu_features().has("avx512f") or lib is None:
        return False
    return _known_product_holds(lib.wb_linear_f32_avx512)


def _known_product_holds(fn, dtype: torch.dtype = torch.float32, rows: int = 5,
                         pack=None) -> bool:
    """Whether the product function `fn` computes a known product (rows x 45 by 19 x 45, a
    bias; the weight through `pack` when its layout is another) within one rounding of dtype."""
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(rows, 45, generator=gen).to(dtype),
               torch.randn(19, 45, generator=gen).to(dtype),
               torch.randn(19, generator=gen).to(dtype))
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
    lib = library()
    if lib is None or getattr(lib, "wb_linear_bf16", None) is None:
        return False
    return _known_product_holds(lib.wb_linear_bf16, torch.bfloat16, rows=3)


def linear_bf16(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                ) -> torch.Tensor:
    """`x @ weight.T (+ bias)` for bfloat16 CPU tensors, x [..., K], a contiguous weight [N, K]
    and bias [N]: float32 sums rounded once (the caller checks dtypes and layout)."""
    return product(linear_bf16_function(), x, weight, bias)


def linear_bf16_function():
    """The bfloat16 products (AVX-512 BF16)."""
    return _c("wb_linear_bf16")


@functools.cache
def available_amx() -> bool:
    """Whether this CPU has AMX BF16 (probed first: the function would fault without it), the
    library built the AMX products (GCC 11, clang 12), the OS grants this process AMX's tile
    state, and the products compute a known product within one bf16 rounding."""
    if not cpu_features().has("amx_tile", "amx_bf16"):
        return False
    lib = library()
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
    _c("wb_amx_pack")(weight.contiguous().data_ptr(), packed.data_ptr(), n, k)
    return packed


def linear_amx_function():
    """The bfloat16 products on AMX (on `amx_pack`ed weights)."""
    return _c("wb_linear_bf16_amx")


_DTYPES = (torch.float32, torch.bfloat16)  # what the C functions compute in


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     slots: torch.Tensor, lengths: torch.Tensor, scale: float
                     ) -> torch.Tensor | None:
    """One query token per sequence against its context, read in place through its cache slots
    (`wb_decode_attention`): q [B, Hq, D]; k_cache, v_cache [S, Hkv, D]; slots [B, Lmax] int64
    (row b's first lengths[b] are its context); lengths [B] int64 -> [B, Hq, D] in q's dtype
    (float32 or bfloat16, the caches' too; q and slots may be row slices of larger tensors).
    None where the C function does not take the shape (another dtype, a head size that is not a
    multiple of 8, more than 256 or over 16 query heads per KV head): the caller computes it
    otherwise."""
    b, hq, d = q.shape
    if not q.dtype == k_cache.dtype == v_cache.dtype in _DTYPES:
        return None
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    if slots.stride(1) != 1:
        slots = slots.contiguous()
    out = torch.empty((b, hq, d), dtype=q.dtype)
    code = _c("wb_decode_attention")(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
        slots.stride(0), lengths.data_ptr(), out.data_ptr(), b, hq, k_cache.shape[1], d,
        slots.shape[1], scale, q.dtype == torch.bfloat16, torch.get_num_threads())
    return out if code == 0 else None


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slots: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                    max_length: int, scale: float, window: int | None = None,
                    softcap: float | None = None, alibi: torch.Tensor | None = None,
                    alibi_scale: float = 1.0) -> torch.Tensor | None:
    """Every query token against its own context, read in place through the cache slots
    (`wb_paged_attention`, the batch-invariant engine's attention): q [T, Hq, D]; k_cache,
    v_cache [S, Hkv, D]; query t at position lengths[t] - 1 reads the keys in slots
    slots[offsets[t]:offsets[t] + lengths[t]] (int64; max_length: the longest), its last `window`,
    scores soft-capped at `softcap`, ALiBi `alibi` [Hq] float32 slopes (times `alibi_scale`)
    -> [T, Hq, D] in q's dtype. None where the C function does not take the shape (as
    `decode_attention`)."""
    t, hq, d = q.shape
    if not q.dtype == k_cache.dtype == v_cache.dtype in _DTYPES:
        return None
    if q.stride(2) != 1 or q.stride(1) != d:
        q = q.contiguous()
    if alibi is not None:
        alibi = alibi.float().contiguous()
    out = torch.empty((t, hq, d), dtype=q.dtype)
    code = _c("wb_paged_attention")(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), slots.data_ptr(),
        offsets.data_ptr(), lengths.data_ptr(), window or 0, softcap or 0.0,
        None if alibi is None else alibi.data_ptr(), alibi_scale, out.data_ptr(), t, hq,
        k_cache.shape[1], d, max_length, scale, q.dtype == torch.bfloat16,
        torch.get_num_threads())
    return out if code == 0 else None


def add_rms_norm(hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A pre-norm layer's residual add and RMSNorm in one pass (`wb_add_rms_norm`): hidden,
    delta [M, H] contiguous, weight [H], all float32 or all bfloat16 -> (hidden + delta, or
    hidden itself without delta; transformers' RMSNorm of that with `weight`). None where the C
    function does not take them (another dtype or layout, a hidden size not a multiple of 8)."""
    m, h = hidden.shape
    if not (hidden.dtype == weight.dtype in _DTYPES and hidden.is_contiguous()
            and (delta is None or (delta.dtype == hidden.dtype and delta.is_contiguous()))):
        return None
    out = torch.empty_like(hidden) if delta is not None else hidden
    normed = torch.empty_like(hidden)
    code = _c("wb_add_rms_norm")(
        hidden.data_ptr(), None if delta is None else delta.data_ptr(), weight.data_ptr(),
        out.data_ptr(), normed.data_ptr(), m, h, eps, hidden.dtype == torch.bfloat16,
        torch.get_num_threads())
    return (out, normed) if code == 0 else None


def rope_write_kv(qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                  slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  num_heads: int, num_kv_heads: int) -> torch.Tensor | None:
    """A step's rotary embedding and KV-cache write in one pass (`wb_rope_write_kv`): qkv
    [T, (Hq + 2 Hkv) D] (rows may be strided), cos and signed_sin [T, D] (the decoder's
    `_signed_sin`), slots [T] int64 -> the rotated queries [T, Hq, D]; the rotated keys and the
    values are written at `slots` of k_cache and v_cache [S, Hkv, D]. Bit for bit the
    decoder's `_rotate` and `index_copy_`. None where the C function does not take them (other
    dtypes or layouts, a head size not a multiple of 16): the caller computes it otherwise."""
    t, width = qkv.shape
    d = k_cache.shape[-1]
    if not (qkv.dtype == cos.dtype == signed_sin.dtype == k_cache.dtype == v_cache.dtype
            in _DTYPES and qkv.stride(1) == 1 and cos.is_contiguous()
            and signed_sin.is_contiguous() and slots.dtype == torch.int64
            and slots.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous()
            and width == (num_heads + 2 * num_kv_heads) * d and cos.shape == (t, d)):
        return None
    q = torch.empty((t, num_heads, d), dtype=qkv.dtype)
    code = _c("wb_rope_write_kv")(
        qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), signed_sin.data_ptr(), slots.data_ptr(),
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), t, num_heads, num_kv_heads, d,
        qkv.dtype == torch.bfloat16, torch.get_num_threads())
    return q if code == 0 else None


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """`silu(gate) * up` of a fused gate/up projection's output [M, 2F] (`wb_silu_mul`) ->
    [M, F], as torch's two ops within the last bit of silu's exp. None where the C function does
    not take it (another dtype or layout, F not a multiple of 8)."""
    m, width = gate_up.shape
    if not (gate_up.dtype in _DTYPES and gate_up.is_contiguous()):
        return None
    out = torch.empty((m, width // 2), dtype=gate_up.dtype)
    code = _c("wb_silu_mul")(gate_up.data_ptr(), out.data_ptr(), m, width // 2,
                             gate_up.dtype == torch.bfloat16, torch.get_num_threads())
    return out if code == 0 else None


STACK_TENSORS = 12  # per layer, the tensors `decode_stack` reads (csrc/decode_stack.c's order)
STACK_FUNCTIONS = 4  # and the product functions of its four projections


def stack_table(layers: Sequence[tuple[Any, ...]], eps: Sequence[tuple[float, float]]
                ) -> tuple[Any, Any]:
    """`decode_stack`'s tables: per layer its `STACK_TENSORS` tensors in csrc/decode_stack.c's
    order (the input norm's weight, Q/K/V's weight and bias, O's, the post-attention norm's
    weight, gate/up's, down's, the K and V caches; None for a missing bias), then the product
    functions of Q/K/V, O, gate/up and down (ctypes functions, each on its weight's layout), and
    its two norms' epsilons. The caller keeps the tensors alive as long as the tables."""
    width = STACK_TENSORS + STACK_FUNCTIONS
    if any(len(layer) != width for layer in layers):
        raise ValueError(f"each layer takes {STACK_TENSORS} tensors and {STACK_FUNCTIONS} "
                         "functions")
    flat = [None if t is None else t.data_ptr() for layer in layers
            for t in layer[:STACK_TENSORS]]
    flat = [address for i, layer in enumerate(layers) for address in (
        flat[i * STACK_TENSORS:(i + 1) * STACK_TENSORS]
        + [ctypes.cast(fn, ctypes.c_void_p).value for fn in layer[STACK_TENSORS:]])]
    return ((ctypes.c_void_p * len(flat))(*flat),
            (ctypes.c_float * (2 * len(eps)))(*(e for pair in eps for e in pair)))


def decode_stack(tables: tuple[Any, Any], num_layers: int, hidden: torch.Tensor,
                 cos: torch.Tensor, signed_sin: torch.Tensor, slot_mapping: torch.Tensor,
                 slots: torch.Tensor, lengths: torch.Tensor, num_heads: int, num_kv_heads: int,
                 head_dim: int, intermediate: int, scale: float) -> torch.Tensor | None:
    """A decode step through every layer in one C call (`wb_decode_stack`): hidden [T, H]
    (one token per sequence), cos and signed_sin [T, D], slot_mapping [T], slots [T, Lmax] and
    lengths [T] as `rope_write_kv` and `decode_attention` take them, each projection through
    the function its table names -> [T, H] before the final norm, bit for bit the decoder's
    loop over the same C functions. None where a function refused the shapes (nothing then is
    half done that the loop would not redo)."""
    t, h = hidden.shape
    d = head_dim
    if not (hidden.is_contiguous() and cos.is_contiguous() and signed_sin.is_contiguous()
            and cos.shape == signed_sin.shape == (t, d) and slots.shape[0] == t
            and hidden.dtype == cos.dtype == signed_sin.dtype in _DTYPES
            and slot_mapping.dtype == slots.dtype == lengths.dtype == torch.int64
            and slot_mapping.is_contiguous() and lengths.is_contiguous()
            and slots.stride(1) == 1):
        return None
    out = torch.empty_like(hidden)
    code = _c("wb_decode_stack")(
        tables[0], tables[1], num_layers, hidden.data_ptr(), out.data_ptr(), cos.data_ptr(),
        signed_sin.data_ptr(), slot_mapping.data_ptr(), slots.data_ptr(), slots.stride(0),
        lengths.data_ptr(), slots.shape[1], t, h, num_heads, num_kv_heads, d, intermediate,
        scale, hidden.dtype == torch.bfloat16, torch.get_num_threads())
    return out if code == 0 else None
