"""A GGUF file's quantized weights as the file holds them: blocks of bytes, one row of blocks per
output feature.

A 2-D weight `[N, K]` of a block type (`BLOCK_TYPES`) is stored as N rows, each `K / block_size`
blocks of `block_bytes` bytes, in GGML's layout (row n's blocks cover its K weights in order).
`QuantizedWeight` keeps those bytes untouched; the engine's GGUF kernel multiplies float32
activations with them in C, and `dequantize()` is the float32 reference it is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class BlockType:
    """One GGML block type: `block_size` weights in `block_bytes` bytes."""

    name: str  # GGML's name: "Q4_1"
    ggml_type: int  # its number in a GGUF file's tensor info
    block_size: int
    block_bytes: int


BLOCK_TYPES = {t.name: t for t in (
    BlockType("Q4_0", 2, 32, 18),  # d (f16), 16 bytes of 4-bit q: w = (q - 8) d
    BlockType("Q4_1", 3, 32, 20),  # d, m (f16), 16 bytes of 4-bit q: w = q d + m
    BlockType("Q8_0", 8, 32, 34),  # d (f16), 32 int8 q: w = q d
    BlockType("Q4_K", 12, 256, 144),  # d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of q
    BlockType("Q5_K", 13, 256, 176),  # d, dmin, scales, 32 bytes of high bits, 128 of q
    BlockType("Q6_K", 14, 256, 210),  # 128 bytes low 4 bits, 64 high 2 bits, 16 int8 scales, d
)}


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A weight `[out_features, in_features]` as GGML blocks: `data` is uint8
    `[out_features, in_features // block_size * block_bytes]`, each row one output feature's
    blocks, contiguous."""

    kind: str  # a key of BLOCK_TYPES
    out_features: int
    in_features: int
    data: torch.Tensor

    def __post_init__(self) -> None:
        block = BLOCK_TYPES.get(self.kind)
        if block is None:
            raise ValueError(f"GGUF block type must be one of {sorted(BLOCK_TYPES)}, "
                             f"got {self.kind!r}")
        if self.in_features % block.block_size:
            raise ValueError(f"a {self.kind} weight's in_features must be a multiple of "
                             f"{block.block_size}, got {self.in_features}")
        row_bytes = self.in_features // block.block_size * block.block_bytes
        if tuple(self.data.shape) != (self.out_features, row_bytes):
            raise ValueError(f"a {self.kind} weight [{self.out_features}, {self.in_features}] "
                             f"takes uint8 data [{self.out_features}, {row_bytes}], got "
                             f"{tuple(self.data.shape)}")

    @property
    def block(self) -> BlockType:
        return BLOCK_TYPES[self.kind]

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    @property
    def nbytes(self) -> int:
        return self.data.numel()
