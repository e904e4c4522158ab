"""Float32 to a tensor's dtype, rounded to nearest even on every Triton backend.

torch rounds each bfloat16 op's float32 result to nearest even; compiled Triton's casts do too,
but Triton's interpreter truncates float32 to bfloat16 (`interpreter._convert_float`), a whole
ulp off in half the cases. `round_to` rounds the float32 bits to nearest even first, so the
cast after it is exact on both, and the kernels' bfloat16 results are the same bits compiled
and interpreted (a few integer ops per element: nothing against the memory traffic). float16
and float32 casts are numpy's in the interpreter, already to nearest even.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """x (float32) -> dtype, to nearest even (NaN stays NaN)."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        rounded = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
        y = rounded.to(tl.bfloat16)
    else:
        y = x.to(dtype)
    return y


@triton.jit
def rounded(x, dtype: tl.constexpr):
    """x (float32) rounded as stored in dtype, kept in float32 (torch's rounding between two
    ops in that dtype)."""
    return round_to(x, dtype).to(tl.float32)
