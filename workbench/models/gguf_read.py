"""A GGUF file's quantized weights, keyed by the parameter names of the model they load into.

`read_quantized(path, model)` hands back, for every 2-D weight of `model` that the file holds in a
block type (`BLOCK_TYPES`), the file's blocks for it as a `QuantizedWeight`, with what transformers
does to that tensor on load done to the block rows instead. Nothing is tabulated here: the names
come from transformers' own map (`get_gguf_hf_weights_map`), and what its architecture's
`TensorProcessor` does to a tensor is found out by running it on two index probes (each entry its
row number, then its column number). Where the output is a reordering of whole rows (Llama's Q/K
head permutation, Bloom's fused QKV), the same reordering of the block rows dequantizes to the same
weight. Anything else (GPT-2's transposed projections, a change of values) leaves the weight
float, as does every tensor of another type (F32, F16, BF16, other quants). A tied LM head shares
its embedding's blocks.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import gguf
import numpy as np
import torch
from transformers import PreTrainedModel
from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
from transformers.integrations.gguf.utils import is_gguf_arch_supported
from transformers.modeling_gguf_pytorch_utils import (
    TENSOR_PROCESSORS,
    TensorProcessor,
    get_gguf_hf_weights_map,
)

from workbench.models.gguf_blocks import BLOCK_TYPES, QuantizedWeight

_KIND_OF_GGML_TYPE = {block.ggml_type: name for name, block in BLOCK_TYPES.items()}


def read_quantized(gguf_path: str | Path, model: PreTrainedModel) -> dict[str, QuantizedWeight]:
    """The file's block weights keyed by `model`'s parameter names, as transformers places them.

    `model` is the transformers model that this file loads into (from the file itself, or from its
    float32 conversion): its parameter names, shapes and tied weights decide what comes back.
    """
    reader = gguf.GGUFReader(str(gguf_path))
    architecture = str(reader.fields["general.architecture"].contents())
    if is_gguf_arch_supported(architecture):
        raise NotImplementedError(
            f"GGUF architecture {architecture!r} loads through transformers' packed-weight path "
            f"(its own conversion mapping), which read_quantized does not follow yet.")
    config = _file_config(reader, architecture, model.config.model_type)
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config)
    with _name_maps_built_once():
        names = get_gguf_hf_weights_map(model, processor)  # GGUF name -> parameter name
    parameters = dict(model.named_parameters(remove_duplicate=False))
    found: dict[str, QuantizedWeight] = {}
    for tensor in reader.tensors:
        kind = _KIND_OF_GGML_TYPE.get(int(tensor.tensor_type))
        if kind is None or len(tensor.shape) != 2:
            continue
        out_features, in_features = tensor.data.shape[0], int(tensor.shape[0])
        placed = _place_rows(processor, tensor.name, out_features, in_features, names)
        if placed is None:
            continue
        name, rows = placed
        parameter = parameters.get(name)
        if parameter is None:
            continue  # transformers drops it too (a tensor the model has no place for)
        if tuple(parameter.shape) != (out_features, in_features):
            raise ValueError(f"GGUF tensor {tensor.name!r} [{out_features}, {in_features}] maps "
                             f"to {name!r}, whose shape is {tuple(parameter.shape)}")
        data = torch.from_numpy(np.ascontiguousarray(tensor.data[rows]))  # a copy, off the mmap
        found[name] = QuantizedWeight(kind, out_features, in_features, data)
    return _with_tied_names(found, model)


def _file_config(reader: gguf.GGUFReader, architecture: str, model_type: str) -> dict:
    """The config fields transformers reads from the file's `{architecture}.*` keys (the head
    counts its tensor processors use), without its second pass over the whole file."""
    mapping = cast(dict[str, str | None], GGUF_CONFIG_MAPPING.get(architecture)
                   or GGUF_CONFIG_MAPPING.get(model_type, {}))  # the legacy loader's table
    config = {}
    for key, field in reader.fields.items():
        prefix, _, rest = key.partition(".")
        if prefix == architecture and (name := mapping.get(rest)):
            config[name] = field.contents()
    return config


@contextmanager
def _name_maps_built_once() -> Iterator[None]:
    """Within the block, gguf-py builds its name map once per (architecture, layer count).

    transformers' `get_gguf_hf_weights_map` rebuilds it for every submodule it recurses into
    (6 s of 11 for SmolLM2's 30 layers); the map is a pure function of its arguments. Model loads
    run on the process's one model thread, so nothing else sees the swap.
    """
    build = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(build)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = build


def _place_rows(processor: TensorProcessor, gguf_name: str, rows: int, cols: int,
                names: dict[str, str]) -> tuple[str, np.ndarray] | None:
    """(parameter name, source row of each of its rows) when transformers' processing of the
    tensor `gguf_name` only reorders its rows; None when it does anything else or drops it."""
    # probes: [rows, cols], entry (n, k) holds n, then k; broadcast views, so nothing is allocated
    # unless the processor moves data
    row_probe = np.broadcast_to(np.arange(rows, dtype=np.float64)[:, None], (rows, cols))
    col_probe = np.broadcast_to(np.arange(cols, dtype=np.float64)[None, :], (rows, cols))
    row_out = _process(processor, gguf_name, row_probe, names)
    col_out = _process(processor, gguf_name, col_probe, names)
    if row_out is None or col_out is None or row_out[0] != col_out[0]:
        return None
    name, row_of, col_of = row_out[0], row_out[1], col_out[1]
    if row_of.shape != (rows, cols) or col_of.shape != (rows, cols):
        return None  # transposed or reshaped: the blocks cannot follow
    source = row_of[:, 0]
    if not (row_of == source[:, None]).all() or not (col_of == col_probe[:1]).all():
        return None  # not whole rows kept in order (a transpose of a square weight, a value change)
    source_rows = source.astype(np.int64)
    if not np.array_equal(source_rows, source) or not np.array_equal(np.sort(source_rows),
                                                                     np.arange(rows)):
        return None  # not a permutation of the rows
    return name, source_rows


def _process(processor: TensorProcessor, gguf_name: str, probe: np.ndarray,
             names: dict[str, str]) -> tuple[str, np.ndarray] | None:
    """What transformers' loader makes of `probe` stored as `gguf_name`: (parameter name, values)."""
    parsed: dict[str, dict] = {"tensors": {}}
    result = processor.process(weights=probe, name=gguf_name, tensor_key_mapping=names,
                               parsed_parameters=parsed)
    if result.name is None:  # the processor stored it itself (GPT-2's output.weight), or took it
        if len(parsed["tensors"]) != 1:  # apart (experts)
            return None
        name, value = next(iter(parsed["tensors"].items()))
        return name, np.asarray(value)
    if result.name not in names:
        return None
    return names[result.name], np.asarray(result.weights)


def _with_tied_names(found: dict[str, QuantizedWeight],
                     model: torch.nn.Module) -> dict[str, QuantizedWeight]:
    """`found` plus every other name of the same parameter (a tied LM head: its embedding's)."""
    aliases: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(parameter), []).append(name)
    parameters = dict(model.named_parameters(remove_duplicate=False))
    tied = dict(found)
    for name, weight in found.items():
        for alias in aliases[id(parameters[name])]:
            tied.setdefault(alias, weight)
    return tied


def quantized_summary(weights: dict[str, QuantizedWeight]) -> str:
    """One line for a log: how many weights stay as blocks, and their bytes, per block type.

    A weight shared by several names (a tied LM head) counts once.
    """
    unique = {id(weight): weight for weight in weights.values()}.values()
    count = Counter(weight.kind for weight in unique)
    size: Counter[str] = Counter()
    for weight in unique:
        size[weight.kind] += weight.nbytes
    parts = ", ".join(f"{kind} {count[kind]} ({size[kind] / 2**20:.1f} MiB)" for kind in sorted(count))
    shared = len(weights) - len(unique)
    tail = f"; {shared} more name(s) share them" if shared else ""
    return (f"{len(unique)} GGUF weights kept as blocks, {sum(size.values()) / 2**20:.1f} MiB: "
            f"{parts or 'none'}{tail}")
