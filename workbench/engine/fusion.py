"""Faster projections for transformers' decoder layers, leaving their forward code as it is.

Two changes, used only in reduced precision (in float32 the model stays exactly as loaded, for
the numerical tests):
- Fusion: transformers' attention calls `q_proj(x)`, `k_proj(x)`, `v_proj(x)` on the same tensor,
  and its MLP `gate_proj(x)` then `up_proj(x)`. Each group becomes parts of one `FusedGroup`: the
  first part called with a tensor computes the concatenated projection once, the others return
  their slice of it (exact: the same products).
- Kernels: on CPU in bfloat16 every projection (and the LM head) becomes a `FastLinear` with the
  best kernel this torch build has (`best_kernel`):
  - "onednn": the weight prepacked in oneDNN's blocked layout, bit-identical to `F.linear`;
  - "mkl": as "onednn", except one-row products (a single sequence decoding), which go through
    MKL's bf16 GEMM (`engine/mkl.py`) on a plain copy of the weight: 16-31% less time per
    single-stream step in alternating runs here, for a second copy of the projection weights
    in memory (+210 MB for SmolLM2; the LM head shares its plain weight with tied embeddings).
    Chosen on Intel CPUs only (`mkl.preferred`: measured on an Intel Xeon; MKL is known to take
    slower paths elsewhere), so a machine always runs the same kernels. fp32 accumulation and
    one rounding, like oneDNN, but a product may differ from oneDNN's in the last bit of bf16;
  - "torch": `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workbench.engine import mkl

KERNELS = ("mkl", "onednn", "torch")

_GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))
_SINGLES = (("self_attn", "o_proj"), ("mlp", "down_proj"))


def can_prepack(weight: torch.Tensor) -> bool:
    """oneDNN prepacking applies to bfloat16 weights on a CPU whose torch build has it."""
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    try:  # a build without the op raises here, not in the middle of a step
        probe = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(2, 2, dtype=weight.dtype), 1)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 2, dtype=weight.dtype), probe, None,
                                           "none", [], "")
    except (AttributeError, RuntimeError):
        return False
    return True


def best_kernel(weight: torch.Tensor) -> str:
    """The fastest `KERNELS` entry that works for `weight` here."""
    if not can_prepack(weight):
        return "torch"
    return "mkl" if mkl.preferred() else "onednn"


class FastLinear(nn.Module):
    """`y = x W^T + b` through one of `KERNELS` (see the module docstring)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernel: str):
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        self.out_features, self.in_features = weight.shape
        self.kernel = kernel
        weight = weight.detach()
        packed = None if kernel == "torch" else torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        plain = weight.contiguous() if kernel != "onednn" else None
        self.register_buffer("weight", plain, persistent=False)  # [out, in] or None
        self.register_buffer("packed_weight", packed, persistent=False)  # oneDNN layout or None
        self.register_buffer("bias", None if bias is None else bias.detach(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        one_row = x.numel() == self.in_features
        if self.kernel == "mkl" and one_row and x.dtype == torch.bfloat16:
            return mkl.linear(x, self.weight, self.bias)
        if self.packed_weight is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias,
                                                      "none", [], "")
        return F.linear(x, self.weight, self.bias)

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


def fuse_projections(model: nn.Module, kernel: str | None = None) -> int:
    """Fuses Q/K/V and gate/up in every decoder layer and gives every projection and the LM head
    `kernel` (None: `best_kernel`; with "torch" the unfused projections stay as they are);
    returns how many fused groups."""
    kernel = best_kernel(next(model.parameters())) if kernel is None else kernel
    fused = 0
    for layer in model.model.layers:
        for owner_name, names in _GROUPS:
            owner = getattr(layer, owner_name, None)
            linears = [getattr(owner, n, None) for n in names] if owner is not None else []
            if not linears or not all(isinstance(lin, nn.Linear) for lin in linears):
                continue
            group = FusedGroup(linears, kernel)
            for i, name in enumerate(names):
                setattr(owner, name, FusedPart(group, i, linears[i].in_features))
            fused += 1
        if kernel != "torch":
            for owner_name, name in _SINGLES:
                owner = getattr(layer, owner_name, None)
                lin = getattr(owner, name, None)
                if isinstance(lin, nn.Linear):
                    setattr(owner, name, FastLinear(lin.weight, lin.bias, kernel))
    if kernel != "torch" and isinstance(getattr(model, "lm_head", None), nn.Linear):
        model.lm_head = FastLinear(model.lm_head.weight, model.lm_head.bias, kernel)
    return fused

