"""GGUF blocks times int8 activations, llama.cpp's CPU arithmetic (`csrc/gguf_q8.c`).

`gguf_activations="q8"`: each product quantizes its float32 input rows to the weight type's
partner (`PARTNER`: Q4_0 and Q8_0 meet Q8_0, Q4_1 meets Q8_1, the K-quants Q8_K), bit for bit
as llama.cpp's x86 quantizers do (`quantize`), then sums each block's integer products exactly
and scales them in float32 (`linear`): the result is `exact_product` up to float32 summation
order (`error_bound`), whatever the row count, the chunk or the thread count. The functions read
the weight interleaved by 16 rows (`QuantizedWeight.interleaved`). Two instruction
sets: "avx512" (AVX-512 VNNI with VL and BW, F16C) and "avx2" (AVX2, FMA, F16C); `isas()` lists
those this CPU runs, best first; `WORKBENCH_GGUF_ISA=avx2` forces AVX2 here too (the variable
of `gguf_products`).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from workbench.engine.kernels import c_library, c_products, gguf_products
from workbench.models.cpu import cpu_features
from workbench.models.gguf_blocks import BLOCK_TYPES, QuantizedWeight

ISAS = gguf_products.ISAS  # best first: the same ISAs as the float32 arithmetic
_FLAGS = {"avx512": ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
          "avx2": ("avx2", "fma", "f16c")}
ISA_ENV = gguf_products.ISA_ENV
ACTIVATIONS = ("float32", "q8")  # the values of `gguf_activations`
PARTNER = {"Q4_0": "Q8_0", "Q8_0": "Q8_0", "Q4_1": "Q8_1", "Q4_K": "Q8_K", "Q5_K": "Q8_K",
           "Q6_K": "Q8_K"}
# an activation type: values a block, bytes a block
ACTIVATION_BLOCKS = {"Q8_0": (32, 34), "Q8_1": (32, 36), "Q8_K": (256, 292)}


def function_name(kind: str, isa: str) -> str:
    """The C product of a block type (`"Q4_1"`) and an ISA: `wb_q8_linear_q4_1_avx512`."""
    return f"wb_q8_linear_{kind.lower()}_{isa}"


@functools.cache
def available(isa: str) -> bool:
    """Whether this CPU has the ISA's flags (probed first: the functions would fault without
    them), the library built, and its functions compute a known product of every block type."""
    if isa not in _FLAGS:
        raise ValueError(f"GGUF q8 kernel ISA must be one of {list(ISAS)}, got {isa!r}")
    if not cpu_features().has(*_FLAGS[isa]) or c_library.library() is None:
        return False
    return all(_known_product_holds(kind, isa) for kind in BLOCK_TYPES)


def isas() -> list[str]:
    """The ISAs this CPU runs, best first; only `$WORKBENCH_GGUF_ISA` where it is set (an ISA
    this CPU cannot run is an error, never a silent fallback)."""
    return gguf_products.runnable_isas(available, "GGUF q8 kernels")


def linear_function(kind: str, isa: str | None = None):
    """The C product (ctypes, the `wb_linear_fn` signature: float32 rows in and out) for block
    type `kind` on `isa` (default: the best of `isas()`)."""
    if kind not in BLOCK_TYPES:
        raise ValueError(f"GGUF block type must be one of {sorted(BLOCK_TYPES)}, got {kind!r}")
    if isa is None:
        runnable = isas()
        if not runnable:
            raise RuntimeError("no GGUF q8 kernel runs here: it needs AVX2, FMA and F16C, and "
                               "a C compiler to build the kernels")
        isa = runnable[0]
    elif not available(isa):
        raise RuntimeError(f"the {isa} GGUF q8 kernels do not run here")
    return getattr(c_library.library(), function_name(kind, isa))


def linear(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None,
           isa: str | None = None) -> torch.Tensor:
    """x float32 [..., K] quantized per row to the weight's partner type, times the weight's
    blocks (+ bias float32 [N]) -> float32 [..., N]: `exact_product` up to summation order."""
    n, k = weight.shape
    if x.dtype != torch.float32 or x.shape[-1] != k:
        raise ValueError(f"x must be float32 [..., {k}], got {x.dtype} {tuple(x.shape)}")
    if bias is not None and (bias.dtype != torch.float32 or tuple(bias.shape) != (n,)):
        raise ValueError(f"bias must be float32 [{n}], got {bias.dtype} {tuple(bias.shape)}")
    if weight.data.dtype != torch.uint8 or not weight.data.is_contiguous():
        raise ValueError("the weight's data must be contiguous uint8")
    weight = weight.interleaved()  # what the functions read (a copy, unless it is)
    return c_products.product(linear_function(weight.kind, isa), x, weight.data,
                              None if bias is None else bias.contiguous(), out_features=n)


def quantize(x: torch.Tensor, kind: str) -> torch.Tensor:
    """Rows x float32 [M, K] as llama.cpp's x86 quantizer writes them: `kind` "Q8_0", "Q8_1" or
    "Q8_K" -> uint8 [M, K / block * bytes] (GGML's block layout)."""
    size, nbytes = ACTIVATION_BLOCKS[kind]
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] % size:
        raise ValueError(f"x must be float32 [M, K] with K a multiple of {size}, got "
                         f"{x.dtype} {tuple(x.shape)}")
    if not cpu_features().has("avx2", "fma", "f16c"):
        raise RuntimeError("the quantizers need AVX2, FMA and F16C")
    x = x.contiguous()
    m, k = x.shape
    out = torch.empty(m, k // size * nbytes, dtype=torch.uint8)
    c_library.function(f"wb_quantize_{kind.lower()}")(x.data_ptr(), out.data_ptr(), m, k)
    return out


def _halves(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The f16 at byte `at` of each block [B, bytes] as float32 [B]."""
    return blocks[:, at:at + 2].contiguous().view(torch.float16).float().squeeze(-1)


_Terms = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, Any]


def _weight_terms(weight: QuantizedWeight) -> _Terms:
    """A weight's integer codes and scales, per block of 32 values (K-quants: per sub-block of
    32; Q6_K's two scales of 16 as a code factor): (codes int64 [N, G, 32], d [N, G/8 or G],
    per-group integer scale int64 [N, G, 32] or None, mins' term (m or dmin, mins) or None)."""
    n, k = weight.shape
    blocks = weight.ggml().data.reshape(-1, weight.block.block_bytes)
    kind = weight.kind
    if kind in ("Q4_0", "Q4_1", "Q8_0"):
        if kind == "Q8_0":
            codes = blocks[:, 2:].contiguous().view(torch.int8).long()
        else:
            packed = blocks[:, 2 if kind == "Q4_0" else 4:].long()
            codes = torch.cat([packed & 15, packed >> 4], dim=-1) - (8 if kind == "Q4_0" else 0)
        d = _halves(blocks, 0)
        m = _halves(blocks, 2) if kind == "Q4_1" else None
        return codes.view(n, -1, 32), d.view(n, -1), None, None if m is None else m.view(n, -1)
    if kind == "Q6_K":
        ql = blocks[:, :128].long().reshape(-1, 2, 2, 32)
        low = torch.stack([ql & 15, ql >> 4], dim=2).reshape(-1, 2, 4, 32)
        qh = blocks[:, 128:192].long().reshape(-1, 2, 1, 32)
        high = (qh >> torch.tensor([0, 2, 4, 6]).view(1, 1, 4, 1)) & 3
        codes = ((low | (high << 4)) - 32).reshape(n, -1, 32)
        scales = blocks[:, 192:208].contiguous().view(torch.int8).long()  # [B, 16]
        scale = scales.repeat_interleave(16, dim=-1).reshape(n, -1, 32)
        return codes, _halves(blocks, 208).view(n, -1), scale, None
    scales = blocks[:, 4:16].long()
    a, b, c = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([a & 63, (c & 15) | ((a >> 6) << 4)], dim=-1)  # [B, 8]
    mins = torch.cat([b & 63, (c >> 4) | ((b >> 6) << 4)], dim=-1)
    if kind == "Q4_K":
        qs = blocks[:, 16:].long().reshape(-1, 4, 32)
        codes = torch.stack([qs & 15, qs >> 4], dim=2).reshape(-1, 8, 32)
    else:  # Q5_K
        qh = blocks[:, 16:48].long().unsqueeze(1)
        high = (qh >> torch.arange(8).view(1, 8, 1)) & 1
        qs = blocks[:, 48:].long().reshape(-1, 4, 32)
        codes = torch.stack([qs & 15, qs >> 4], dim=2).reshape(-1, 8, 32) | (high << 4)
    scale = sc.unsqueeze(-1).expand(-1, 8, 32).reshape(n, -1, 32)
    dmin = _halves(blocks, 2).view(n, -1)
    return codes.reshape(n, -1, 32), _halves(blocks, 0).view(n, -1), scale, (
        dmin, mins.reshape(n, -1))


def _activation_terms(blocks: torch.Tensor, kind: str
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Quantized rows [M, bytes] of `kind` -> (codes int64 [M, K/32, 32], d float32 [M, blocks],
    s float32 [M, blocks] (Q8_1) or None)."""
    m = blocks.shape[0]
    size, nbytes = ACTIVATION_BLOCKS[kind]
    b = blocks.reshape(-1, nbytes)
    if kind == "Q8_K":
        codes = b[:, 4:260].contiguous().view(torch.int8).long()
        d = b[:, :4].contiguous().view(torch.float32).squeeze(-1)
        return codes.view(m, -1, 32), d.view(m, -1), None
    at = 4 if kind == "Q8_1" else 2
    codes = b[:, at:].contiguous().view(torch.int8).long()
    s = _halves(b, 2).view(m, -1) if kind == "Q8_1" else None
    return codes.view(m, -1, 32), _halves(b, 0).view(m, -1), s


def exact_product(x: torch.Tensor, weight: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """What `linear(x, weight)` computes, exactly (float64 [M, N]), and the magnitude its
    float32 summation rounds against: for each block, fp32(d_w * d_a) times the exact integer
    sum of the codes' products (K-quants: weighed by the sub-block scales), Q4_1's m_w * s_a,
    the K-quants' -fp32(d_a * dmin_w) * sum(m_j * bsum_j); the magnitude is the same sum of
    absolute products (what every partial sum is bounded by)."""
    x = x.reshape(-1, weight.in_features).float()
    kind = PARTNER[weight.kind]
    codes_a, d_a, s_a = _activation_terms(quantize(x, kind), kind)
    codes_w, d_w, scale, mins = _weight_terms(weight)
    prod = codes_a.unsqueeze(1) * codes_w.unsqueeze(0)  # [M, N, G, 32]
    if scale is not None:
        prod = prod * scale.unsqueeze(0)
    per = 8 if weight.block.block_size == 256 else 1  # groups of 32 per block
    m, n = x.shape[0], weight.out_features
    sums = prod.sum(-1).view(m, n, -1, per).sum(-1).double()  # exact integers [M, N, blocks]
    mags = prod.abs().sum(-1).view(m, n, -1, per).sum(-1).double()
    d = (d_a.unsqueeze(1) * d_w.unsqueeze(0)).double()  # fp32 products, as the C code rounds
    value, magnitude = (d * sums).sum(-1), (d.abs() * mags).sum(-1)
    if weight.kind == "Q4_1":
        assert mins is not None and s_a is not None
        term = s_a.double().unsqueeze(1) * mins.double().unsqueeze(0)
        value, magnitude = value + term.sum(-1), magnitude + term.abs().sum(-1)
    elif mins is not None:  # Q4_K, Q5_K: the mins through the activations' sums of 32
        dmin, mn = mins
        bsum = codes_a.sum(-1)  # [M, G]
        mterm = (bsum.unsqueeze(1) * mn.unsqueeze(0)).view(m, n, -1, 8).sum(-1).double()
        dm = (d_a.unsqueeze(1) * dmin.unsqueeze(0)).double()
        value = value - (dm * mterm).sum(-1)
        magnitude = magnitude + (dm * mterm).abs().sum(-1)
    return value, magnitude


def error_bound(weight: QuantizedWeight, magnitude: torch.Tensor) -> torch.Tensor:
    """How far `linear` may be from `exact_product`: each of its float32 roundings is within
    half an ulp of a partial sum no larger than the magnitude. A block costs at most two (a
    fused multiply-add, and Q4_1's second one for m_w * s_a) or, K-quants, three (the block's
    int32 sum to float, its fma, the mins' fma), and the bias one: ((2 or 3) * blocks + 8) *
    2^-24 * magnitude."""
    blocks = weight.in_features // weight.block.block_size
    per = 3 if weight.block.block_size == 256 else 2
    return (per * blocks + 8) * 2.0 ** -24 * magnitude


def _known_product_holds(kind: str, isa: str) -> bool:
    """Whether the `kind` function on `isa` computes `exact_product` of random blocks (3 rows,
    21 outputs: a group of 16 interleaved rows and 5 after it) within `error_bound`."""
    block = BLOCK_TYPES[kind]
    gen = torch.Generator().manual_seed(0)
    weight = gguf_products.random_blocks(kind, 21, block.block_size * 2, gen)  # a group + 5
    x = torch.randn(3, weight.in_features, generator=gen)
    expected, magnitude = exact_product(x, weight)
    weight = weight.interleaved()
    got = c_products.product(getattr(c_library.library(), function_name(kind, isa)), x,
                             weight.data, None, out_features=21)
    return bool(((got.double() - expected).abs() <= error_bound(weight, magnitude)).all())
