"""A GGUF file's quantized weights as the file holds them: blocks of bytes, one row of blocks per
output feature.

A 2-D weight `[N, K]` of a block type (`BLOCK_TYPES`) is stored as N rows, each `K / block_size`
blocks of `block_bytes` bytes, in GGML's layout (row n's blocks cover its K weights in order).
`QuantizedWeight` keeps those bytes untouched; the engine's GGUF kernel multiplies float32
activations with them in C, and `dequantize()` is the float32 reference it is tested against.
The int8 kernel reads them interleaved instead (`layout="rows16"`, `interleaved()`): each 16
rows' blocks side by side, the same bytes moved within the rows' own span.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    layout: str = "ggml"  # or "rows16" (`interleaved`)

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
        if self.layout not in LAYOUTS:
            raise ValueError(f"a weight's layout must be one of {LAYOUTS}, got {self.layout!r}")

    @property
    def block(self) -> BlockType:
        return BLOCK_TYPES[self.kind]

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out_features, in_features]: GGML's formulas, equal bit for bit
        to gguf-py's `gguf.quants.dequantize`."""
        blocks = self.ggml().data.reshape(-1, self.block.block_bytes)  # [B, block_bytes]
        return _DEQUANTIZE[self.kind](blocks).reshape(self.out_features, self.in_features)

    @classmethod
    def quantize(cls, weight: torch.Tensor, kind: str) -> QuantizedWeight:
        """`weight` [N, K] quantized to `kind` by gguf-py (Q4_0, Q4_1, Q8_0: the types it can
        quantize), for tests."""
        import numpy as np  # deferred: gguf-py (and numpy) only for tests that build weights
        from gguf import GGMLQuantizationType, quants

        if kind not in ("Q4_0", "Q4_1", "Q8_0"):
            raise ValueError(f"gguf-py quantizes Q4_0, Q4_1 and Q8_0, not {kind!r}")
        n, k = weight.shape
        data = quants.quantize(weight.detach().float().numpy().astype(np.float32),
                               GGMLQuantizationType[kind])
        return cls(kind, n, k, torch.from_numpy(np.ascontiguousarray(data)))

    @classmethod
    def cat(cls, weights: Sequence[QuantizedWeight]) -> QuantizedWeight:
        """The weights' rows stacked (fused Q/K/V, gate/up): one kind and in_features."""
        if not weights:
            raise ValueError("cat takes at least one weight")
        first = weights[0]
        if any(weight.layout != "ggml" for weight in weights):
            raise ValueError("cat takes weights in GGML's layout (interleave the result)")
        for weight in weights[1:]:
            if (weight.kind, weight.in_features) != (first.kind, first.in_features):
                raise ValueError(f"cat takes weights of one kind and in_features, got "
                                 f"{first.kind} [.., {first.in_features}] and {weight.kind} "
                                 f"[.., {weight.in_features}]")
        data = torch.cat([weight.data for weight in weights])
        return cls(first.kind, data.shape[0], first.in_features, data)

    def rows(self, start: int, stop: int) -> QuantizedWeight:
        """Rows [start, stop) as a view: the same bytes, no copy (interleaved: where both ends
        fall on a group's edge or the end, else a copy in GGML's layout)."""
        if not 0 <= start <= stop <= self.out_features:
            raise ValueError(f"rows: [{start}, {stop}) is not within [0, {self.out_features}]")
        if self.layout == "rows16":
            if start % 16 or (stop % 16 and stop != self.out_features):
                return self.ggml().rows(start, stop)
            return QuantizedWeight(self.kind, stop - start, self.in_features,
                                   self.data[start:stop], "rows16")
        return QuantizedWeight(self.kind, stop - start, self.in_features, self.data[start:stop])

    def interleaved(self, in_place: bool = False) -> QuantizedWeight:
        """This weight in the "rows16" layout: per group of 16 rows and per block, each field of
        the block (`FIELDS`) for the 16 rows in turn: their d side by side (fp16), then their m
        (Q4_1), then their codes in words of 4 bytes (word j: bytes [4j, 4j + 4) of each row's
        codes, the 16 rows in turn; the K-quants' packed scales byte by byte); the rows after
        the last full group as they are. `in_place`: this weight's own bytes rearranged (its
        object, and any other that shares them, then read wrongly: for an engine that takes
        the weight over)."""
        if self.layout == "rows16":
            return self
        return QuantizedWeight(self.kind, self.out_features, self.in_features,
                               _regroup(self, in_place, inverse=False), "rows16")

    def ggml(self) -> QuantizedWeight:
        """This weight in GGML's layout (itself, or a copy of an interleaved one)."""
        if self.layout == "ggml":
            return self
        return QuantizedWeight(self.kind, self.out_features, self.in_features,
                               _regroup(self, False, inverse=True))

    def select_rows(self, index: torch.Tensor | Sequence[int]) -> QuantizedWeight:
        """The rows `index` (a permutation or a subset of out_features), in that order."""
        index = torch.as_tensor(index, dtype=torch.int64)
        if index.dim() != 1:
            raise ValueError(f"select_rows takes a 1-D index, got shape {tuple(index.shape)}")
        if index.numel() and not (0 <= int(index.min()) and int(index.max()) < self.out_features):
            raise ValueError(f"select_rows: an index out of [0, {self.out_features})")
        return QuantizedWeight(self.kind, index.numel(), self.in_features,
                               self.ggml().data.index_select(0, index).contiguous())


LAYOUTS = ("ggml", "rows16")
# The rows16 layout per type: a block's fields as (offset, bytes, unit); within a block of 16
# rows, each field in turn holds unit 0 of the 16 rows, then unit 1, ... (d and m: one fp16 a
# row; codes: words of 4 bytes; the K-quants' packed scales: byte planes)
FIELDS = {
    "Q4_0": ((0, 2, 2), (2, 16, 4)),
    "Q4_1": ((0, 2, 2), (2, 2, 2), (4, 16, 4)),
    "Q8_0": ((0, 2, 2), (2, 32, 4)),
    "Q4_K": ((0, 2, 2), (2, 2, 2), (4, 12, 1), (16, 128, 4)),
    "Q5_K": ((0, 2, 2), (2, 2, 2), (4, 12, 1), (16, 32, 4), (48, 128, 4)),
    "Q6_K": ((0, 128, 4), (128, 64, 4), (192, 16, 1), (208, 2, 2)),
}


def _regroup(weight: QuantizedWeight, in_place: bool, inverse: bool) -> torch.Tensor:
    """`weight.data` interleaved by 16 rows (`QuantizedWeight.interleaved`), or back
    (`inverse`); into a copy, or in place (a few groups at a time through a small buffer)."""
    bb = weight.block.block_bytes
    g = weight.in_features // weight.block.block_size
    data = weight.data if in_place else weight.data.clone()
    full = weight.out_features // 16 * 16
    for start in range(0, full, 16 * 256):
        part = data[start:min(start + 16 * 256, full)]
        n = part.shape[0] // 16
        if inverse:
            inter, at, fields = part.reshape(n, g, 16 * bb), 0, []
            for _, size, unit in FIELDS[weight.kind]:
                field = inter[..., at:at + 16 * size].reshape(n, g, size // unit, 16, unit)
                fields.append(field.permute(0, 3, 1, 2, 4).reshape(n, 16, g, size))
                at += 16 * size
            moved = torch.cat(fields, dim=-1)
        else:
            rows = part.reshape(n, 16, g, bb)
            moved = torch.cat([rows[..., at:at + size].reshape(n, 16, g, size // unit, unit)
                               .permute(0, 2, 3, 1, 4).reshape(n, g, 16 * size)
                               for at, size, unit in FIELDS[weight.kind]], dim=-1)
        part.copy_(moved.reshape(part.shape))
    return data


def _halves(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The f16 at byte `at` of each block, as float32: [B, 1]."""
    return blocks[:, at:at + 2].contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Bytes [..., n] -> their low nibbles then their high nibbles [..., 2n] (uint8)."""
    return torch.cat([packed & 0x0F, packed >> 4], dim=-1)


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:  # [B, 18] -> [B, 32]
    q = _nibbles(blocks[:, 2:]).to(torch.int8) - 8
    return _halves(blocks, 0) * q.float()


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:  # [B, 20] -> [B, 32]
    return _halves(blocks, 0) * _nibbles(blocks[:, 4:]).float() + _halves(blocks, 2)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:  # [B, 34] -> [B, 32]
    return blocks[:, 2:].contiguous().view(torch.int8).float() * _halves(blocks, 0)


def _scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GGML's 6-bit scales and mins of the K-quants' 12 bytes [B, 12] -> two [B, 8]."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mins


def _k_quant(blocks: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Q4_K / Q5_K: w = d sc q - dmin m per sub-block of 32; q [B, 8, 32] uint8 -> [B, 256]."""
    sc, mins = _scale_min(blocks[:, 4:16])
    d = (_halves(blocks, 0) * sc.float()).unsqueeze(-1)  # [B, 8, 1]
    dm = (_halves(blocks, 2) * mins.float()).unsqueeze(-1)
    return (d * q.float() - dm).reshape(-1, 256)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:  # [B, 144] -> [B, 256]
    qs = blocks[:, 16:].reshape(-1, 4, 32)
    return _k_quant(blocks, torch.stack([qs & 0x0F, qs >> 4], dim=2).reshape(-1, 8, 32))


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:  # [B, 176] -> [B, 256]
    qh = blocks[:, 16:48].unsqueeze(1)  # [B, 1, 32]: bit j for sub-block j
    high = (qh >> torch.arange(8, dtype=torch.uint8).view(1, 8, 1)) & 1
    qs = blocks[:, 48:].reshape(-1, 4, 32)
    low = torch.stack([qs & 0x0F, qs >> 4], dim=2).reshape(-1, 8, 32)
    return _k_quant(blocks, low | (high << 4))


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:  # [B, 210] -> [B, 256]
    ql = blocks[:, :128].reshape(-1, 2, 2, 32)  # [B, half, 2, 32]
    low = torch.stack([ql & 0x0F, ql >> 4], dim=2).reshape(-1, 2, 4, 32)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32)
    high = (qh >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)) & 3
    q = (low | (high << 4)).to(torch.int8) - 32  # [B, 2, 4, 32]
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float()  # [B, 16]
    d = (_halves(blocks, 208) * scales).unsqueeze(-1)  # [B, 16, 1]
    return (d * q.reshape(-1, 16, 16).float()).reshape(-1, 256)


_DEQUANTIZE = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k,
               "Q6_K": _q6_k}
