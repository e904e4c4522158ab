"""Faster projections for transformers' decoder layers, leaving their forward code as it is.

Two changes, in every dtype:
- Fusion: transformers' attention calls `q_proj(x)`, `k_proj(x)`, `v_proj(x)` on the same tensor,
  and its MLP `gate_proj(x)` then `up_proj(x)`. Each group becomes parts of one `FusedGroup`: the
  first part called with a tensor computes the concatenated projection once, the others return
  their slice of it (the same products, each output a dot product of the same two rows).
- Kernels: every projection (and the LM head) becomes a `FastLinear` on the kernel chosen for
  this machine and dtype (`engine/kernels.py`):
  - "avx2" (float32): products of up to `AVX2_MAX_ROWS` rows (decoding, beams, small batches)
    through `engine/gemv.py`, which reads each weight once per call; longer ones (prefill
    chunks) through `F.linear`. Same weight tensor, no copy; float32 sums in another order
    than BLAS's, so outputs differ from `F.linear` in the last bits;
  - "onednn" (bfloat16): the weight prepacked in oneDNN's blocked layout, bit-identical to
    `F.linear`;
  - "amx" (bfloat16): as "onednn", except products of up to `AMX_MAX_ROWS` rows (decoding,
    beams, small batches), which go through `gemv.c`'s AMX function on a copy of the weight in
    its tiles' layout (in place of the plain copy the next two keep): fp32 accumulation and one
    rounding, a product may differ from oneDNN's in the last bit of bf16;
  - "avx512bf16" (bfloat16): as "onednn", except products of up to `BF16_MAX_ROWS` rows (a
    few sequences or beams decoding) and of `BF16_BROADCAST_ROWS` rows, which go through `gemv.c`'s AVX-512 BF16 kernel on a
    plain copy of the weight (the same copy as "mkl"'s): fp32 accumulation and one rounding,
    a product may differ from oneDNN's in the last bit of bf16;
  - "mkl" (bfloat16): as "onednn", except one-row products (a single sequence decoding), which go
    through MKL's bf16 GEMM (`engine/mkl.py`) on a plain copy of the weight; the copy costs the
    projection weights' size again (the LM head shares its plain weight with tied embeddings).
    fp32 accumulation and one rounding, like oneDNN, but a product may differ from oneDNN's in
    the last bit of bf16;
  - "torch": `F.linear`.
The README's Benchmark section has what each measured. A batch-invariant engine's projections
compute in fixed tiles on any of them (`make_batch_invariant`, `FastLinear.tile_rows`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workbench.engine import gemv, kernels, mkl

AVX2_MAX_ROWS = 48  # longer products go to BLAS (its GEMM is tuned for many rows)
# the C kernel beats oneDNN up to four rows (a step's products on an AMX Xeon: 12.6 vs 18.4 ms
# at one row, 18.7 vs 19.9 at four, 26 vs 20 at eight), and a step in one C call needs it
BF16_MAX_ROWS = 4
# and from 12 to 16 rows (an even K) its broadcast tiles beat oneDNN without AMX (26 vs 35 ms)
BF16_BROADCAST_ROWS = (12, 16)
AMX_MAX_ROWS = 32  # as fast as oneDNN's at 32 rows, faster below
C_KERNELS = frozenset({"avx2", "amx", "avx512bf16"})  # those with `gemv.c` products (c_function)

# sibling linears that read the same input, fused wherever a layer has them (any submodule:
# `self_attn`, `attn`, `mlp`, a mixture of experts' shared expert)
_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def can_prepack(weight: torch.Tensor) -> bool:
    """Whether oneDNN prepacking applies to `weight`: bfloat16 on a CPU that runs it."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and kernels.missing("onednn", weight.dtype, kernels.cpu_features()) is None)


INVARIANT_ROWS = 4  # a batch-invariant engine's library products: always this many rows a call
# and its `gemv.c` products: at most this many rows a call, each row's sum in the dot products'
# one order whatever the count (below the float32 broadcast tiles' 7 and 13, the bf16 ones' 12)
INVARIANT_C_ROWS = {"avx2": 6, "avx512bf16": 8, "amx": 16}


class FastLinear(nn.Module):
    """`y = x W^T + b` through one of `KERNELS` (see the module docstring). With `tile_rows`
    (the batch-invariant engine's, `make_batch_invariant`) a row's result is the same bits
    whatever rows share its step: a library kernel gets exactly `tile_rows` rows a call, the
    last tile padded with zeros (one path, one shape, whose sums over k run in one order for
    every row of the tile); a `gemv.c` kernel up to `INVARIANT_C_ROWS` rows a call, unpadded
    (its dot products sum each row in one order for any count)."""

    tile_rows: int = 0  # 0: the rows as they come

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernel: str):
        super().__init__()
        if kernel not in kernels.KERNELS:
            raise ValueError(f"kernel must be one of {kernels.KERNELS}, got {kernel!r}")
        self.out_features, self.in_features = weight.shape
        self.kernel = kernel
        weight = weight.detach()
        prepack = kernel in ("onednn", "mkl", "avx512bf16", "amx")
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1) if prepack else None
        plain = weight.contiguous() if kernel not in ("onednn", "amx") else None
        self.register_buffer("weight", plain, persistent=False)  # [out, in] or None
        self.register_buffer("packed_weight", packed, persistent=False)  # oneDNN layout or None
        self.register_buffer("amx_weight", gemv.amx_pack(weight) if kernel == "amx" else None,
                             persistent=False)  # the AMX tiles' layout or None
        self.register_buffer("bias", None if bias is None else bias.detach(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tile_rows:
            return self._in_tiles(x)
        return self._product(x)

    def _in_tiles(self, x: torch.Tensor) -> torch.Tensor:
        """`_product` of `tile_rows` rows at a time (see the class docstring); each tile a
        64-byte aligned block, as a fresh tensor is (a library may pick its path by
        alignment). A `gemv.c` kernel's products take up to `INVARIANT_C_ROWS` rows a call
        instead, unpadded: its dot products sum every row in one order for any count."""
        k, n, size = self.in_features, self.out_features, self.tile_rows
        flat = x.reshape(-1, k)
        m = flat.shape[0]
        c_rows = INVARIANT_C_ROWS.get(self.kernel, 0)
        fn = self.c_function(c_rows, x.dtype) if c_rows else None
        if fn is not None:
            return self._c_chunks(fn, flat.contiguous(), c_rows).view(*x.shape[:-1], n)
        padded = flat.new_zeros(-(-m // size) * size, k)
        padded[:m] = flat
        out = torch.empty(padded.shape[0], n, dtype=x.dtype, device=x.device)
        for i in range(0, padded.shape[0], size):
            tile = padded[i:i + size]
            if tile.data_ptr() % 64:
                tile = tile.clone()
            out[i:i + size] = self._product(tile)
        return out[:m].view(*x.shape[:-1], n)

    def _c_chunks(self, fn, x: torch.Tensor, rows: int) -> torch.Tensor:
        """x [M, K] through the C product `fn`, `rows` rows a call -> [M, N]."""
        m, k, n = x.shape[0], self.in_features, self.out_features
        out = torch.empty(m, n, dtype=x.dtype)
        weight, bias = self.c_weight(), self._buffers["bias"]
        assert weight is not None  # a C kernel keeps its weight
        w, b, threads = weight.data_ptr(), None if bias is None else bias.data_ptr(), \
            torch.get_num_threads()
        size = x.element_size()
        for i in range(0, m, rows):
            fn(x.data_ptr() + i * k * size, w, b, out.data_ptr() + i * n * size,
               min(rows, m - i), n, k, threads)
        return out

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        # not self.weight: nn.Module's __getattr__ costs a microsecond; the kernel checks say
        # which buffers are set (Any: the dict's values are typed `Tensor | None`)
        tensors: dict[str, Any] = self._buffers
        fn = self.c_function(rows, x.dtype)
        if fn is not None:  # then its weight is there
            return gemv.product(fn, x, tensors["amx_weight" if self.kernel == "amx" else "weight"],
                                tensors["bias"], self.out_features)
        if self.kernel == "mkl" and rows == 1 and x.dtype == torch.bfloat16:
            return mkl.linear(x, tensors["weight"], tensors["bias"])
        if tensors["packed_weight"] is not None:
            return torch.ops.mkldnn._linear_pointwise(x, tensors["packed_weight"],
                                                      tensors["bias"], "none", [], "")
        return F.linear(x, tensors["weight"], tensors["bias"])

    def c_function(self, rows: int, dtype: torch.dtype):
        """The `gemv.c` product function that `rows` rows of `dtype` go through here, or None
        (another kernel, more rows than it takes)."""
        if self.kernel == "avx2" and rows <= AVX2_MAX_ROWS and dtype == torch.float32:
            return gemv.linear_function()
        if self.kernel == "avx512bf16" and dtype == torch.bfloat16 and (
                rows <= BF16_MAX_ROWS or (BF16_BROADCAST_ROWS[0] <= rows <= BF16_BROADCAST_ROWS[1]
                                          and self.in_features % 2 == 0)):
            return gemv.linear_bf16_function()
        if self.kernel == "amx" and rows <= AMX_MAX_ROWS and dtype == torch.bfloat16:
            return gemv.linear_amx_function()
        return None

    def c_weight(self) -> torch.Tensor | None:
        """The weight `c_function`'s function reads: the AMX tiles' copy, else the plain one."""
        return self._buffers["amx_weight" if self.kernel == "amx" else "weight"]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"kernel={self.kernel}"


class FusedGroup:
    """One projection for several linears that read the same input."""

    def __init__(self, linears: list[nn.Linear], kernel: str):
        weight = torch.cat([lin.weight.detach() for lin in linears])  # [sum(out), in]
        biases = [lin.bias for lin in linears]
        bias = torch.cat([b.detach() for b in biases]) if all(
            b is not None for b in biases) else None
        self.linear = FastLinear(weight, bias, kernel)
        self.sizes = [lin.out_features for lin in linears]
        self._input: torch.Tensor | None = None
        self._parts: tuple[torch.Tensor, ...] = ()

    def part(self, index: int, x: torch.Tensor) -> torch.Tensor:
        if self._input is not x:
            self._parts = self.linear(x).split(self.sizes, dim=-1)
            self._input = x
        out = self._parts[index]
        if index == len(self.sizes) - 1:  # the last reader: drop the references
            self._input, self._parts = None, ()
        return out


class FusedPart(nn.Module):
    """Stands in for one of the group's linears."""

    def __init__(self, group: FusedGroup, index: int, in_features: int):
        super().__init__()
        self.group = group
        self.index = index
        self.in_features = in_features
        self.out_features = group.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.part(self.index, x)


def fuse_projections(model: Any, kernel: str | None = None, layers: Any = None) -> int:
    """Fuses Q/K/V and gate/up wherever a decoder layer has them (`_GROUPS`) and gives every
    other `nn.Linear` of the layers, and the LM head, `kernel` (None: `kernels.choose` for the
    model's dtype and device; with "torch" the unfused projections stay as they are); returns
    how many fused groups. `layers`: the decoder layers (default: a Llama-family model's)."""
    if kernel is None:
        weight = next(model.parameters())
        kernel = kernels.choose(weight.dtype, weight.device.type).kernel
    fused = 0
    for layer in (model.model.layers if layers is None else layers):
        for owner in list(layer.modules()):
            for names in _GROUPS:
                linears: list[Any] = [getattr(owner, n, None) for n in names]
                if not all(type(lin) is nn.Linear for lin in linears):
                    continue
                group = FusedGroup(linears, kernel)
                for i, name in enumerate(names):
                    setattr(owner, name, FusedPart(group, i, linears[i].in_features))
                fused += 1
        if kernel != "torch":
            for owner in list(layer.modules()):
                for name, lin in list(owner.named_children()):
                    if type(lin) is nn.Linear:
                        setattr(owner, name, FastLinear(lin.weight, lin.bias, kernel))
    if kernel != "torch" and isinstance(getattr(model, "lm_head", None), nn.Linear):
        model.lm_head = FastLinear(model.lm_head.weight, model.lm_head.bias, kernel)
    return fused


def make_batch_invariant(model: Any, kernel: str) -> int:
    """Every projection of `model` (after `fuse_projections`: its layers', the LM head, and
    any other `nn.Linear` or GPT-2-style `Conv1D`, which become `FastLinear`s on `kernel`,
    "torch" included) computes in fixed tiles (`FastLinear.tile_rows` = `INVARIANT_ROWS`);
    returns how many projections. (An `nn.Linear` subclass computes `x W^T + b` as nn.Linear
    does, in its own order: Falcon's `FalconLinear` adds its bias after the product.)"""
    count = 0
    for owner in list(model.modules()):
        for name, child in list(owner.named_children()):
            if isinstance(child, nn.Linear):  # subclasses too: Falcon's `FalconLinear`
                child = FastLinear(child.weight, child.bias, kernel)
            elif type(child).__name__ == "Conv1D" and hasattr(child, "nf"):  # [in, out] weight
                child = FastLinear(child.weight.t().contiguous(), child.bias, kernel)
            elif not isinstance(child, FastLinear):
                continue
            child.tile_rows = INVARIANT_ROWS
            setattr(owner, name, child)
            count += 1
    for group in {id(m.group): m.group for m in model.modules() if isinstance(m, FusedPart)
                  }.values():
        group.linear.tile_rows = INVARIANT_ROWS
        count += 1
    return count
