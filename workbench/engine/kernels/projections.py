"""The kernels that run a model's projections: one class each, chosen once per process from a
table by probed capability.

Every kernel has the same small interface (vLLM's `LinearMethodBase` is the pattern):
`missing(dtype, features)` says what this process lacks to run it (None: it can), `prepare(weight,
bias)` keeps a projection's weights once in the layouts the kernel reads (`LinearWeights`),
`c_function(weights, rows, dtype)` is the C product function (`engine/kernels/csrc/`) it runs `rows`
rows of `dtype` through, if any (what a decode step in one C call needs),
`invariant_function(weights, dtype)` the batch-invariant engine's one C product function for any
row count, if it has one (a row's bits independent of the others), and `apply(weights, x)`
computes `x W^T + b`.

| kernel       | dtype    | needs                                               | what it does
|--------------|----------|-----------------------------------------------------|-------------------------
| "avx2"       | float32  | AVX2 + FMA, a C compiler (`c_products.py`)          | products of up to 48
|              |          |                                                     | rows in C (decoding,
|              |          |                                                     | beams, small batches);
|              |          |                                                     | prefill via `F.linear`
| "amx"        | bfloat16 | "onednn"'s needs + AMX BF16, a C compiler that      | products of up to 32
|              |          | targets it, the OS's grant of AMX state             | rows on AMX tiles in C;
|              |          |                                                     | more rows as "onednn"
| "avx512bf16" | bfloat16 | "onednn"'s needs + AVX-512 BF16, a C compiler       | every row count in C,
|              |          |                                                     | batch-invariant by
|              |          |                                                     | construction
| "onednn"     | bfloat16 | AVX-512 BW/VL/DQ or AVX-NE-CONVERT, oneDNN in torch | weights prepacked by
|              |          |                                                     | oneDNN
| "torch"      | any      | nothing                                             | `F.linear`
| "gguf"       | float32  | AVX2 + FMA, a C compiler; a model loaded with       | products with a GGUF
|              |          | `dtype="gguf"` (its blocks), never `--kernel`       | file's blocks in C
| "gguf_q8"    | float32  | "gguf"'s, F16C (AVX-512 VNNI: its faster functions);| llama.cpp's: int8
|              |          | `gguf_activations="q8"`, never `--kernel`           | activations, integer
|              |          |                                                     | block sums in C

A batch-invariant engine (`fusion.make_batch_invariant`) runs the projections of "avx2" and
"avx512bf16" through their invariant products (`invariant_function`: `csrc/linear_f32.c`'s
broadcast tiles for every row count, or its blocks of eight weight rows in the lanes for one to
six, the same sums; `csrc/linear_bf16.c`'s one function, the default engine's
too; one call per projection, prefill and decode alike), those of the other kernels in fixed
tiles (`FastLinear.tile_rows`).

The small operators between the projections (`KernelChoice.ops`) run in C wherever the C
library is available and the kernel is not "torch" ("c"), in float32 and bfloat16: decode
attention reading the KV cache in place (`c_attention.decode_attention`), each residual add with the
RMSNorm after it (`c_layer_ops.add_rms_norm`), rotary embedding with the KV write
(`c_layer_ops.rope_write_kv`) and SiLU gating (`c_layer_ops.silu_mul`). With "torch", or without the library,
they are torch's ops ("torch": SDPA over the gathered context, bit-identical to transformers'
layers).

`choose(dtype, device)` takes the first that this process can run, in the table's order for its
dtype ("auto"), or checks the one asked for (`kernel=` / `--kernel`) and refuses it at start-up,
naming the flag and what the machine lacks. `$WORKBENCH_KERNEL` asks for a kernel where those
say "auto", for the models of the dtype it computes in (how `make test-portable` runs the
engine tests on each kernel). Every requirement is a probed capability (`workbench.models.cpu`,
a test product), never a CPU vendor. On CUDA the kernel is always "torch" (cuBLAS).
`python -m workbench.engine.kernels` prints what this machine has and picks.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from workbench.engine.kernels import c_library, c_products, gguf_products, gguf_q8
from workbench.errors import ValidationError
from workbench.models.cpu import CpuFeatures, cpu_features
from workbench.models.gguf_blocks import QuantizedWeight


@dataclass(eq=False)
class LinearWeights:
    """One projection's weights as its kernel keeps them (`LinearKernel.prepare`)."""

    out_features: int
    in_features: int
    bias: torch.Tensor | None
    plain: torch.Tensor | None = None  # [out, in], what `F.linear` reads (None: not kept)
    packed: torch.Tensor | None = None  # oneDNN's blocked layout
    c_weight: Any = None  # what the kernel's C products read (a tensor's memory), or None
    blocks: QuantizedWeight | None = None  # a GGUF weight's blocks ("gguf")
    function: Any = None  # the C product function, where the kernel fixes it at prepare time
    # a GGUF projection of parts in other block types ("gguf": `c_weight` is their table)
    parts: tuple[LinearWeights, ...] = ()


class LinearKernel:
    """A kernel's interface (see the module docstring); the base is `F.linear` ("torch")."""

    name: ClassVar[str] = "torch"
    dtype: ClassVar[torch.dtype | None] = None  # the dtype it computes in (None: any)

    def missing(self, dtype: torch.dtype, features: CpuFeatures) -> str | None:
        """What this process lacks to run the kernel on `dtype` (None: it can run it)."""
        return None

    def prepare(self, weight: Any, bias: torch.Tensor | None) -> LinearWeights:
        """A projection's weights kept once in the layouts the kernel reads: `weight` a tensor
        [out, in] ("gguf": a `QuantizedWeight`)."""
        weight = weight.detach()
        return LinearWeights(weight.shape[0], weight.shape[1],
                             None if bias is None else bias.detach(), plain=weight.contiguous())

    def c_function(self, weights: LinearWeights, rows: int, dtype: torch.dtype) -> Any:
        """The C product function `rows` rows of `dtype` go through (ctypes), or None."""
        return None

    def invariant_function(self, weights: LinearWeights, dtype: torch.dtype) -> Any:
        """The C product function a batch-invariant engine runs any number of rows of `dtype`
        through in one call, each row's output the same bits whatever the other rows (on
        `weights.c_weight`), or None: the engine tiles the rows (`FastLinear.tile_rows`)."""
        return None

    def apply(self, weights: LinearWeights, x: torch.Tensor) -> torch.Tensor:
        fn = self.c_function(weights, x.numel() // weights.in_features, x.dtype)
        if fn is not None:
            return c_products.product(fn, x, weights.c_weight, weights.bias, weights.out_features)
        if weights.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, weights.packed, weights.bias, "none",
                                                      [], "")
        assert weights.plain is not None  # a kernel without C products or packs keeps it
        return F.linear(x, weights.plain, weights.bias)

    def __repr__(self) -> str:
        return f"<kernel {self.name}>"


class Avx2(LinearKernel):
    """float32: products of up to `MAX_ROWS` rows (decoding, beams, small batches) in C
    (`csrc/linear_f32.c`, its AVX-512F functions where the CPU has them), reading each weight
    once per call; longer ones (prefill chunks) through `F.linear`. Same weight tensor, no copy;
    float32 sums in another order than BLAS's, so outputs differ from `F.linear` in the last
    bits.

    A bfloat16 weight (a float32 model whose checkpoint is bfloat16, `loader.load_model`) is
    kept as it is, the only copy, and every row count runs through `wb_linear_f32_w16`: each
    weight widened exactly as it is read, float32 sums in the invariant products' order, so
    the bits are those of the float32 weight it stands for, at half the bytes."""

    name, dtype = "avx2", torch.float32
    MAX_ROWS = 48  # longer products go to BLAS (its GEMM is tuned for many rows)

    def missing(self, dtype, features):
        if dtype != torch.float32:
            return "it computes in float32 (use --dtype float32)"
        if not features.has("avx2", "fma"):
            return f"a CPU with AVX2 and FMA (this one has: {features.summary()})"
        if not c_products.available():
            return "a C compiler to build it (set CC or install gcc; the log says what failed)"
        return None

    def prepare(self, weight, bias):
        weights = super().prepare(weight, bias)
        weights.c_weight = weights.plain
        if weights.plain is not None and weights.plain.dtype == torch.bfloat16:
            weights.plain = None  # F.linear cannot read it beside float32 inputs
            if weights.bias is not None:
                weights.bias = weights.bias.float()
        return weights

    def c_function(self, weights, rows, dtype):
        if dtype != torch.float32:
            return None
        if weights.c_weight.dtype == torch.bfloat16:
            return c_products.linear_w16_function()
        return c_products.linear_function() if rows <= self.MAX_ROWS else None

    def invariant_function(self, weights, dtype):
        if dtype != torch.float32:
            return None
        if weights.c_weight.dtype == torch.bfloat16:  # its products are invariant for any count
            return c_products.linear_w16_function()
        return c_products.linear_invariant_function()


class OneDnn(LinearKernel):
    """bfloat16: the weight prepacked in oneDNN's blocked layout, bit-identical to `F.linear`."""

    name, dtype = "onednn", torch.bfloat16

    def missing(self, dtype, features):
        if dtype != torch.bfloat16:
            return "it computes in bfloat16 (use --dtype bfloat16)"
        if not features.onednn_bf16:
            return ("a CPU with AVX-512 BW/VL/DQ or AVX-NE-CONVERT for oneDNN's bf16 products "
                    f"(this one has: {features.summary()})")
        if not onednn_prepack_works():
            return "a torch build with oneDNN's prepacked linear weights"
        return None

    def prepare(self, weight, bias):
        weight = weight.detach()
        return LinearWeights(weight.shape[0], weight.shape[1],
                             None if bias is None else bias.detach(),
                             packed=torch.ops.mkldnn._reorder_linear_weight(weight, 1))


class Avx512Bf16(OneDnn):
    """bfloat16 in C on the plain weight, the only copy kept (`csrc/linear_bf16.c`'s AVX-512
    BF16 function): one arithmetic for every row count, tiles of dot products whose sums run in
    one order for every output, so a row's bits never depend on the rows beside it (the
    batch-invariant engine runs the same function). One row streams the weights at about the
    memory's read bandwidth, 5-11 rows at 0.7x the time of the broadcast tiles they replace, 512
    rows at the bf16 peak that oneDNN's prepacked copy reached. fp32 accumulation and one
    rounding: a product may differ from oneDNN's in the last bit of bf16."""

    name = "avx512bf16"

    def missing(self, dtype, features):
        lack = super().missing(dtype, features)
        if lack is None and not features.has("avx512f", "avx512bw", "avx512_bf16"):
            return f"a CPU with AVX-512 BF16 (this one has: {features.summary()})"
        if lack is None and not c_products.available_bf16():
            return ("a C compiler that targets AVX-512 BF16 (GCC 10 or clang 9 and later; set "
                    "CC; the log says what failed)")
        return lack

    def prepare(self, weight, bias):
        weights = LinearKernel.prepare(self, weight, bias)
        weights.c_weight = weights.plain
        return weights

    def c_function(self, weights, rows, dtype):
        return c_products.linear_bf16_function() if dtype == torch.bfloat16 else None

    def invariant_function(self, weights, dtype):
        return self.c_function(weights, 0, dtype)


class Amx(OneDnn):
    """bfloat16 in C on AMX tiles (`csrc/linear_amx.c`), every row count, on the weight in its
    tiles' layout, the only copy kept: each pair of 16-row weight blocks stays in L2 while every
    16 input rows multiply with it, so a prefill's many rows read the weights once. fp32
    accumulation and one rounding, a product may differ from oneDNN's in the last bit of
    bf16."""

    name = "amx"

    def missing(self, dtype, features):
        lack = super().missing(dtype, features)
        if lack is None and not features.has("amx_tile", "amx_bf16"):
            return f"a CPU with AMX BF16 (this one has: {features.summary()})"
        if lack is None and not c_products.available_amx():
            return ("a C compiler that targets AMX (GCC 11 or clang 12 and later; set CC) and "
                    "an OS that grants processes AMX's tile state (Linux 5.16); the log says "
                    "what failed")
        return lack

    def prepare(self, weight, bias):
        weight = weight.detach()
        return LinearWeights(weight.shape[0], weight.shape[1],
                             None if bias is None else bias.detach(),
                             c_weight=c_products.amx_pack(weight))

    def c_function(self, weights, rows, dtype):
        return c_products.linear_amx_function() if dtype == torch.bfloat16 else None


class Gguf(LinearKernel):
    """float32 activations times a GGUF file's quantized blocks as the file holds them
    (`QuantizedWeight`: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K), in C (`csrc/gguf.c`, its AVX-512
    or AVX2 functions, `engine/kernels/gguf_products.py`): float32 sums of the dequantized weights, in
    the functions' own order. Chosen by `dtype="gguf"` (the model's blocks), never by
    `--kernel`; the model's other weights stay float32 on the float32 kernel."""

    name, dtype = "gguf", torch.float32

    def missing(self, dtype, features):
        if dtype != torch.float32:
            return "float32 activations"
        if not features.has("avx2", "fma"):
            return f"a CPU with AVX2 and FMA (this one has: {features.summary()})"
        if not gguf_products.isas():
            return "a C compiler to build it (set CC or install gcc; the log says what failed)"
        return None

    def prepare(self, weight, bias):
        """`weight`: a `QuantizedWeight`, or a list of them, each of its own block type, whose
        rows are stacked (a fused Q/K/V whose V the file quantized otherwise): each part's
        product into its columns (`csrc/linear_parts.c`), the bits of the parts apart."""
        bias = None if bias is None else bias.detach().float()
        if isinstance(weight, QuantizedWeight):
            return self._blocks(weight, bias)
        parts = tuple(self._blocks(part, None) for part in weight)
        if len({part.in_features for part in parts}) != 1:
            raise ValueError("the parts of a projection read the same input: one in_features")
        table = torch.tensor([len(parts), *(value for part in parts for value in (
            ctypes.cast(part.function, ctypes.c_void_p).value, part.c_weight.data_ptr(),
            part.out_features))], dtype=torch.int64)
        return LinearWeights(sum(part.out_features for part in parts), parts[0].in_features,
                             bias, c_weight=table, parts=parts,
                             function=c_library.function("wb_linear_parts"))

    def _blocks(self, weight, bias) -> LinearWeights:
        """One `QuantizedWeight`'s weights, its blocks as this kernel's functions read them."""
        if not isinstance(weight, QuantizedWeight) or weight.layout != "ggml":
            raise TypeError(f"the gguf kernel multiplies GGUF blocks in GGML's layout, got "
                            f"{getattr(weight, 'layout', type(weight))}")
        return LinearWeights(weight.out_features, weight.in_features, bias,
                             c_weight=weight.data, blocks=weight,
                             function=gguf_products.linear_function(weight.kind))

    def c_function(self, weights, rows, dtype):
        return weights.function if dtype == torch.float32 else None


class GgufQ8(Gguf):
    """As "gguf", except that each product quantizes its float32 input rows to the weight
    type's partner (Q8_0, Q8_1, Q8_K), bit for bit as llama.cpp's x86 quantizers, and sums
    each block's int8 products exactly in int32 (`csrc/gguf_q8.c`, its AVX-512 VNNI or AVX2
    functions, `engine/kernels/gguf_q8.py`): llama.cpp's CPU arithmetic, up to float32 summation
    order. Chosen by `gguf_activations="q8"` with `dtype="gguf"`, never by `--kernel`."""

    name = "gguf_q8"

    def missing(self, dtype, features):
        if dtype != torch.float32:
            return "float32 activations"
        if not features.has("avx2", "fma", "f16c"):
            return f"a CPU with AVX2, FMA and F16C (this one has: {features.summary()})"
        if not gguf_q8.isas():
            return "a C compiler to build it (set CC or install gcc; the log says what failed)"
        return None

    def _blocks(self, weight, bias):
        weights = super()._blocks(weight, bias)
        # its functions read the blocks interleaved by 16 rows: rearranged in place, taken over
        weights.blocks = weight.interleaved(in_place=True)
        weights.function = gguf_q8.linear_function(weight.kind)
        return weights


# the table: every kernel by name, and per dtype the order "auto" tries them in ("gguf" comes
# with a model's blocks, `dtype="gguf"`)
TABLE: dict[str, LinearKernel] = {k.name: k for k in (Avx2(), Amx(), Avx512Bf16(), OneDnn(),
                                                      LinearKernel(), Gguf(), GgufQ8())}
BLOCK_KERNELS = {"float32": "gguf", "q8": "gguf_q8"}  # by `gguf_activations`
KERNELS = tuple(name for name in TABLE if name not in BLOCK_KERNELS.values())  # `--kernel`'s
DTYPE_OF = {name: TABLE[name].dtype for name in KERNELS if TABLE[name].dtype is not None}
_AUTO_ORDER = {torch.float32: ("avx2", "torch"),
               torch.bfloat16: ("amx", "avx512bf16", "onednn", "torch")}


def get(kernel: str | LinearKernel) -> LinearKernel:
    """The kernel named `kernel` (a kernel is itself)."""
    if isinstance(kernel, LinearKernel):
        return kernel
    if kernel not in TABLE:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    return TABLE[kernel]


@dataclass(frozen=True)
class KernelChoice:
    """The kernel a model's projections run on, and why (for the start-up log and the bench)."""

    kernel: str
    dtype: torch.dtype
    device: str
    cpu_flags: str  # the probed flags that matter here ("" on CUDA)
    ops: str = "torch"  # the small ops between the projections: "c" (the C library) or "torch"

    def describe(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        flags = f", cpu flags: {self.cpu_flags}" if self.cpu_flags else ""
        return f"kernel {self.kernel}, ops {self.ops} ({dtype} on {self.device}{flags})"


def missing(kernel: str, dtype: torch.dtype, features: CpuFeatures) -> str | None:
    """What this process lacks to run `kernel` on `dtype` (None: it can run it)."""
    return get(kernel).missing(dtype, features)


def onednn_prepack_works() -> bool:
    """Whether oneDNN's prepacked bf16 linear runs here (a build or ISA without it raises)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(2, 2, dtype=torch.bfloat16), 1)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 2, dtype=torch.bfloat16), packed, None,
                                           "none", [], "")
    except (AttributeError, RuntimeError):
        return False
    return True


def choose(dtype: torch.dtype, device: str = "cpu", requested: str = "auto",
           features: CpuFeatures | None = None, blocks: bool = False,
           activations: str = "float32") -> KernelChoice:
    """The kernel for `dtype` on `device` (see the module docstring); `ValidationError` naming
    `kernel` when the one asked for cannot run here. `blocks`: the model keeps GGUF blocks
    (`dtype="gguf"`), which only "gguf" multiplies, or "gguf_q8" with `activations="q8"`
    (`gguf_activations`)."""
    if blocks:
        return _choose_gguf(dtype, device, requested, features, activations)
    if requested == "auto":
        forced = os.environ.get("WORKBENCH_KERNEL") or "auto"
        if DTYPE_OF.get(forced, dtype) == dtype:
            requested = forced
    if requested not in ("auto", *KERNELS):
        raise ValidationError(f"kernel must be 'auto' or one of {KERNELS}, got {requested!r}.",
                              parameter="kernel", value=requested)
    if not str(device).startswith("cpu"):
        if requested not in ("auto", "torch"):
            raise ValidationError(f"kernel {requested!r} (--kernel) runs on the CPU only; on "
                                  f"{device} the kernel is 'torch'.", parameter="kernel",
                                  value=requested)
        return KernelChoice("torch", dtype, str(device), "")
    features = cpu_features() if features is None else features
    if requested == "auto":
        kernel = next(k for k in _AUTO_ORDER.get(dtype, ("torch",))
                      if missing(k, dtype, features) is None)
    else:
        lack = missing(requested, dtype, features)
        if lack is not None:
            raise ValidationError(f"kernel {requested!r} (--kernel) cannot run here: it needs "
                                  f"{lack}.", parameter="kernel", value=requested)
        kernel = requested
    ops = "c" if kernel != "torch" and features.has("avx2", "fma") and c_products.available() \
        else "torch"
    return KernelChoice(kernel, dtype, "cpu", features.summary(), ops)


def _choose_gguf(dtype: torch.dtype, device: str, requested: str,
                 features: CpuFeatures | None, activations: str = "float32") -> KernelChoice:
    if activations not in BLOCK_KERNELS:
        raise ValidationError(f"gguf_activations must be one of {tuple(BLOCK_KERNELS)}, got "
                              f"{activations!r}.", parameter="gguf_activations",
                              value=activations)
    kernel = BLOCK_KERNELS[activations]
    if requested not in ("auto", "gguf"):
        raise ValidationError(f"kernel {requested!r} (--kernel) cannot multiply a GGUF file's "
                              "blocks (dtype 'gguf'): leave it 'auto'.", parameter="kernel",
                              value=requested)
    features = cpu_features() if features is None else features
    lack = TABLE[kernel].missing(dtype, features) if str(device).startswith("cpu") else \
        f"the CPU, not {device}"
    if lack is not None:
        if kernel == "gguf_q8":
            raise ValidationError(f"gguf_activations 'q8' cannot run here: its kernel needs "
                                  f"{lack}.", parameter="gguf_activations", value=activations)
        raise ValidationError(f"dtype 'gguf' cannot run here: its kernel needs {lack}.",
                              parameter="dtype", value="gguf")
    return KernelChoice(kernel, dtype, "cpu", features.summary(), "c")


def reads_bf16_weights(requested: str = "auto") -> bool:
    """Whether a float32 model on the CPU, its kernel `requested` (`--kernel`), multiplies
    bfloat16 weights as they are ("avx2": a bfloat16 checkpoint's weights then stay bfloat16,
    `load_model(bf16_weights=True)`); False where that kernel cannot run here (the engine
    refuses it later, naming it)."""
    try:
        return choose(torch.float32, "cpu", requested).kernel == "avx2"
    except ValidationError:
        return False


def emulated(dtype: torch.dtype, device: str = "cpu", features: CpuFeatures | None = None
             ) -> bool:
    """Whether `dtype` is bfloat16 on a CPU without native bf16 (slower than float32 there)."""
    features = cpu_features() if features is None else features
    return dtype == torch.bfloat16 and str(device).startswith("cpu") and not features.native_bf16


def runnable(dtype: torch.dtype, features: CpuFeatures | None = None) -> list[str]:
    """Every kernel this process can run for `dtype` on the CPU (what the portable tests force)."""
    features = cpu_features() if features is None else features
    return [k for k in KERNELS if missing(k, dtype, features) is None]


def main() -> None:
    """Prints this machine's probed flags, the kernel (and ops) `auto` picks per dtype, and
    every kernel it can run (one line each: `make test-portable` reads the last)."""
    features = cpu_features()
    limits = f" (limits: {', '.join(features.limits)})" if features.limits else ""
    print(f"cpu flags: {features.summary()}{limits}")
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        choice = choose(dtype, "cpu", features=features)
        print(f"{name}: auto picks {choice.kernel} (ops {choice.ops}); runnable: "
              f"{' '.join(runnable(dtype, features))}")
    print("runnable:", " ".join(k for k in KERNELS if any(
        missing(k, d, features) is None for d in (torch.float32, torch.bfloat16))))


