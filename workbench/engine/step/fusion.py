"""Faster projections for transformers' decoder layers, leaving their forward code as it is.

Two changes, in every dtype:
- Fusion: transformers' attention calls `q_proj(x)`, `k_proj(x)`, `v_proj(x)` on the same tensor,
  and its MLP `gate_proj(x)` then `up_proj(x)`. Each group becomes parts of one `FusedGroup`: the
  first part called with a tensor computes the concatenated projection once, the others return
  their slice of it (the same products, each output a dot product of the same two rows).
- Kernels: every projection (and the LM head) becomes a `FastLinear` on the kernel chosen for
  this machine and dtype (`engine/kernels/projections.py`: one class per kernel, its weights prepared once).
The manual's Benchmark page (docs/benchmark.md) has what each measured. A batch-invariant engine's projections
compute so that a row's bits never depend on the other rows (`make_batch_invariant`,
`FastLinear.tile_rows`): on "avx2" and "avx512bf16" every row count in one call of their
invariant C products, on the other kernels in fixed tiles.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from workbench.engine.kernels import c_products, projections
from workbench.engine.kernels.projections import LinearKernel
from workbench.models import memory
from workbench.models.gguf_blocks import QuantizedWeight
from workbench.models.loader import compute_dtype

C_KERNELS = frozenset({"avx2", "amx", "avx512bf16", "gguf", "gguf_q8"})  # with C products (c_function)

# sibling linears that read the same input, fused wherever a layer has them (any submodule:
# `self_attn`, `attn`, `mlp`, a mixture of experts' shared expert)
_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def can_prepack(weight: torch.Tensor) -> bool:
    """Whether oneDNN prepacking applies to `weight`: bfloat16 on a CPU that runs it."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and projections.missing("onednn", weight.dtype, projections.cpu_features()) is None)


INVARIANT_ROWS = 4  # a batch-invariant engine's library products: always this many rows a call
# and its C products: at most this many rows a call. "avx2" and "avx512bf16": any count, one call
# of their invariant products (`LinearKernel.invariant_function`: a row's sums in one order
# whatever the other rows); "amx": its tiles' 16 rows; "gguf": the block products
# sum each row in one order for any count (`csrc/gguf.c`, and `csrc/gguf_q8.c`, which quantizes
# each row by itself)
ANY_ROWS = 2**31 - 1
INVARIANT_C_ROWS = {"avx2": ANY_ROWS, "avx512bf16": ANY_ROWS, "amx": 16, "gguf": ANY_ROWS,
                    "gguf_q8": ANY_ROWS}


def _taken_over(module: nn.Module, prefix: str, keep_vars: bool) -> None:
    """A `state_dict` pre-hook of the modules an engine puts in a model's place: their weights
    live in the kernel's own layout, so the model's state dict would silently lack them (and a
    checkpoint saved from it would load with random weights in their place)."""
    raise RuntimeError(
        f"{prefix.rstrip('.') or 'this module'} belongs to a workbench engine: LLM(model) "
        "replaces a model's projections with its kernels' own weights, so the model can no "
        "longer give a state dict or be saved. Save it (or copy.deepcopy it) before handing it "
        "to LLM, or load it afresh.")


class FastLinear(nn.Module):
    """`y = x W^T + b` through one of `projections.KERNELS`, its weights prepared once by the kernel
    (`self.weights`). With `tile_rows` (the batch-invariant engine's, `make_batch_invariant`) a
    row's result is the same bits whatever rows share its step: a kernel with invariant C
    products (`LinearKernel.invariant_function`: "avx2", "avx512bf16") takes every row in one
    call, decode steps and prefills alike (`c_function` gives it for any row count); another
    kernel with C products up to `INVARIANT_C_ROWS` rows a call, unpadded (its dot products sum
    each row in one order for any count); a library kernel exactly `tile_rows` rows a call, the
    last tile padded with zeros (one path, one shape, whose sums over k run in one order for
    every row of the tile)."""

    tile_rows: int = 0  # 0: the rows as they come

    def __init__(self, weight: torch.Tensor | QuantizedWeight | list[QuantizedWeight],
                 bias: torch.Tensor | None, kernel: str | LinearKernel,
                 sources: tuple[torch.Tensor, ...] = ()):
        """`weight`: a tensor, GGUF blocks, or parts in blocks of several types (the "gguf"
        kernels' `prepare`). `sources`: the model's weights that `weight` was made of (a fused
        group's, the float weight a GGUF block stands for); once the kernel has its layout,
        the pages of a checkpoint's file under them and under `weight` that it did not keep
        are given back (`memory.release`): one copy of each weight stays resident."""
        super().__init__()
        self.register_state_dict_pre_hook(_taken_over)
        self.kernel = projections.get(kernel)
        self.weights = self.kernel.prepare(weight, bias)
        self.out_features, self.in_features = self.weights.out_features, self.weights.in_features
        kept = (self.weights.plain, self.weights.packed, self.weights.c_weight,
                *(part.c_weight for part in self.weights.parts))
        memory.release(*sources, *([weight] if isinstance(weight, torch.Tensor) else []),
                       keep=kept)

    @property
    def weight(self) -> torch.Tensor | None:
        """The plain weight [out, in] where the kernel keeps one."""
        return self.weights.plain

    @property
    def bias(self) -> torch.Tensor | None:
        return self.weights.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tile_rows:
            return self._in_tiles(x)
        return self.kernel.apply(self.weights, x)

    def _in_tiles(self, x: torch.Tensor) -> torch.Tensor:
        """The product as the class docstring says: every row in one call of the kernel's
        invariant C products where it has them; else up to `INVARIANT_C_ROWS` rows a call of
        its C products, unpadded (its dot products sum every row in one order for any count);
        else `tile_rows` rows at a time, each tile a 64-byte aligned block, as a fresh tensor is
        (a library may pick its path by alignment)."""
        k, n, size = self.in_features, self.out_features, self.tile_rows
        flat = x.reshape(-1, k)
        invariant = self.kernel.invariant_function(self.weights, x.dtype)
        if invariant is not None:
            return c_products.product(invariant, flat, self.c_weight(), self.weights.bias,
                                      n).view(*x.shape[:-1], n)
        m = flat.shape[0]
        c_rows = INVARIANT_C_ROWS.get(self.kernel.name, 0)
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
            out[i:i + size] = self.kernel.apply(self.weights, tile)
        return out[:m].view(*x.shape[:-1], n)

    def _c_chunks(self, fn, x: torch.Tensor, rows: int) -> torch.Tensor:
        """x [M, K] through the C product `fn`, `rows` rows a call -> [M, N]."""
        m, k, n = x.shape[0], self.in_features, self.out_features
        out = torch.empty(m, n, dtype=x.dtype)
        weight, bias = self.c_weight(), self.weights.bias
        assert weight is not None  # a C kernel keeps its weight
        w, b, threads = weight.data_ptr(), None if bias is None else bias.data_ptr(), \
            torch.get_num_threads()
        size = x.element_size()
        for i in range(0, m, rows):
            fn(x.data_ptr() + i * k * size, w, b, out.data_ptr() + i * n * size,
               min(rows, m - i), n, k, threads)
        return out

    def c_function(self, rows: int, dtype: torch.dtype):
        """The C product function that `rows` rows of `dtype` go through here, or None
        (another kernel, more rows than it takes); with `tile_rows`, the kernel's invariant
        products where it has them (any row count: what `forward` computes)."""
        if self.tile_rows:
            invariant = self.kernel.invariant_function(self.weights, dtype)
            if invariant is not None:
                return invariant
        return self.kernel.c_function(self.weights, rows, dtype)

    def c_weight(self) -> Any:
        """What `c_function`'s function reads (the AMX tiles' copy, the plain weight...)."""
        return self.weights.c_weight

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"kernel={self.kernel.name}"


class FusedGroup:
    """One projection for several linears that read the same input: `linear` computes their
    outputs concatenated (`sizes` each)."""

    def __init__(self, linear: FastLinear, sizes: list[int]):
        self.linear = linear
        self.sizes = sizes
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
        self.register_state_dict_pre_hook(_taken_over)
        self.group = group
        self.index = index
        self.in_features = in_features
        self.out_features = group.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.part(self.index, x)


def _fused(linears: list[nn.Linear], blocks: list[QuantizedWeight | None], kernel: str,
           fallback: str) -> FastLinear | None:
    """One `FastLinear` for `linears` stacked by rows: their GGUF blocks on "gguf" where each
    has blocks (one copy where all are of one kind; else each part in its own, the kernel's
    parts), their float weights on `fallback` where none has any; None where some have blocks
    and some not: they stay apart."""
    biases = [lin.bias for lin in linears]
    bias = torch.cat([b.detach() for b in biases]) if all(
        b is not None for b in biases) else None
    sources = tuple(lin.weight for lin in linears)
    if all(b is None for b in blocks):
        weight = torch.cat([lin.weight.detach() for lin in linears])  # [sum(out), in]
        return FastLinear(weight, bias, fallback, sources)
    present = [b for b in blocks if b is not None]
    if len(present) != len(blocks):
        return None
    blocks_or_parts = QuantizedWeight.cat(present) if len({b.kind for b in present}) == 1 \
        else present
    return FastLinear(blocks_or_parts, None if bias is None else bias.float(), kernel, sources)


def fuse_projections(model: Any, kernel: str | None = None, layers: Any = None,
                     quantized: dict[str, QuantizedWeight] | None = None) -> int:
    """Fuses Q/K/V and gate/up wherever a decoder layer has them (`_GROUPS`) and gives every
    other `nn.Linear` of the layers, and the LM head, `kernel` (None: `projections.choose` for the
    model's dtype and device; with "torch" the unfused projections stay as they are); returns
    how many fused groups. `layers`: the decoder layers (default: a Llama-family model's).
    `quantized` (with the "gguf" kernel): GGUF blocks by parameter name; a linear with blocks
    multiplies them, the others keep their float weight on the float32 kernel `choose` picks.
    A fused group's blocks are one copy: its members' entries in `quantized` become views of
    their rows in it (SmolLM2: ~44 MB not held twice)."""
    if kernel is None:
        weight = next(model.parameters())
        kernel = projections.choose(compute_dtype(model), weight.device.type).kernel
    quantized = quantized or {}
    fallback = projections.choose(torch.float32).kernel if kernel in (
        "gguf", "gguf_q8") else kernel
    names = {id(m): name for name, m in model.named_modules()}

    def blocks_of(lin: nn.Module) -> QuantizedWeight | None:
        return quantized.get(f"{names.get(id(lin))}.weight")

    def fast(lin: nn.Linear) -> FastLinear:
        blocks = blocks_of(lin)
        if blocks is None:
            return FastLinear(lin.weight, lin.bias, fallback)
        linear = FastLinear(blocks, None if lin.bias is None else lin.bias.float(), kernel,
                            (lin.weight,))
        kept = linear.weights.blocks  # "gguf_q8" interleaves them in place: every name says so
        assert kept is not None  # a block kernel keeps its blocks
        for name in [name for name, weight in quantized.items() if weight is blocks]:
            quantized[name] = kept  # a tied LM head's blocks are its embedding's too
        return linear

    size = sum(p.numel() * p.element_size() for p in model.parameters())
    with memory.dropping_page_cache(memory.page_cache_is_tight(size)):
        fused = _fuse_layers(model, kernel, layers, quantized, names, blocks_of, fast, fallback)
    memory.trim()
    return fused


def _fuse_layers(model, kernel, layers, quantized, names, blocks_of, fast, fallback) -> int:
    """`fuse_projections`' work, layer by layer, then the LM head."""
    fused = 0
    for layer in (model.model.layers if layers is None else layers):
        for owner in list(layer.modules()):
            for group_names in _GROUPS:
                linears: list[Any] = [getattr(owner, n, None) for n in group_names]
                if not all(type(lin) is nn.Linear for lin in linears):
                    continue
                linear = _fused(linears, [blocks_of(lin) for lin in linears], kernel, fallback)
                if linear is None:
                    continue
                group = FusedGroup(linear, [lin.out_features for lin in linears])
                blocks, parts = linear.weights.blocks, linear.weights.parts
                if blocks is not None:  # the members' blocks: views of the fused copy
                    start = 0
                    for lin in linears:
                        stop = start + lin.out_features
                        quantized[f"{names[id(lin)]}.weight"] = blocks.rows(start, stop)
                        start = stop
                for lin, part in zip(linears, parts):  # or each the part the kernel keeps
                    assert part.blocks is not None  # a part is a block kernel's
                    quantized[f"{names[id(lin)]}.weight"] = part.blocks
                for i, name in enumerate(group_names):
                    setattr(owner, name, FusedPart(group, i, linears[i].in_features))
                fused += 1
        if kernel != "torch":
            for owner in list(layer.modules()):
                for name, lin in list(owner.named_children()):
                    if type(lin) is nn.Linear:
                        setattr(owner, name, fast(lin))
    if kernel != "torch" and isinstance(getattr(model, "lm_head", None), nn.Linear):
        model.lm_head = fast(model.lm_head)
    return fused


def invariant_c_rows(model: Any) -> int:
    """The most rows one C call of a batch-invariant engine's decode step may take: the least
    of `INVARIANT_C_ROWS` over the kernels of the model's projections (0 where one has no C
    products; a GGUF model's projections without blocks on the float32 kernel count too;
    `ANY_ROWS` where all have invariant products or block products)."""
    names = {m.kernel.name for m in model.modules() if isinstance(m, FastLinear)}
    names |= {m.group.linear.kernel.name for m in model.modules() if isinstance(m, FusedPart)}
    return min((INVARIANT_C_ROWS.get(name, 0) for name in names), default=0)


def make_batch_invariant(model: Any, kernel: str) -> int:
    """Every projection of `model` (after `fuse_projections`: its layers', the LM head, and
    any other `nn.Linear` or GPT-2-style `Conv1D`, which become `FastLinear`s on `kernel`,
    "torch" included) computes batch-invariantly (`FastLinear.tile_rows` = `INVARIANT_ROWS`:
    the kernel's invariant C products where it has them, else fixed tiles); returns how many
    projections. (An `nn.Linear` subclass computes `x W^T + b` as nn.Linear
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
