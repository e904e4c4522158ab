"""Vectors an intervention adds or sets: given inline (a list, a nested list, a tensor, an array,
or the wire form `{dtype, shape, data: base64}` of `workbench.inside.tensors`) or loaded by a
server from a file (`--steering-vectors name=path`: .pt, .npy, .safetensors, .json).

torch is imported when a vector is read (`importlib.import_module`), so importing this loads
none: the request parameters above it stay torch-free.
"""

from __future__ import annotations

import base64
import importlib
import json
import math
from typing import Any

from workbench.errors import refuse

MAX_VECTOR_FLOATS = 1 << 22  # an inline vector at most (16 MiB of float32)


def to_tensor(value: Any, parameter: str) -> Any:
    """A float32 tensor from a list, nested list, tensor, array or wire dict
    ({dtype, shape, data: base64 little-endian}); refused naming `parameter` otherwise."""
    torch = importlib.import_module("torch")  # deferred, so importing this loads no torch
    if isinstance(value, dict):
        import numpy as np

        try:
            dtype = np.dtype(value["dtype"]).newbyteorder("<")
            data = base64.b64decode(value["data"], validate=True)
            shape = [int(s) for s in value["shape"]]
            if math.prod(shape) > MAX_VECTOR_FLOATS:
                raise ValueError("too large")
            array = np.frombuffer(data, dtype=dtype).reshape(shape)
        except (KeyError, TypeError, ValueError) as error:
            refuse(f"{parameter}: a tensor object is {{dtype, shape, data: base64}} ({error}).",
                   parameter, "tensor")
        return torch.tensor(array.astype(np.float32))
    try:
        tensor = torch.as_tensor(value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as error:
        refuse(f"{parameter} must be a list of numbers ({error}).", parameter, "list")
    if tensor.numel() > MAX_VECTOR_FLOATS:
        refuse(f"{parameter}: at most {MAX_VECTOR_FLOATS} numbers.", parameter, tensor.numel())
    return tensor


def load_vector(path: str, width: int, parameter: str = "steering_vectors") -> Any:
    """One [width] float32 vector from a file: .pt (a tensor), .npy, .safetensors (its one
    tensor) or .json (a list of numbers); refused naming `parameter` otherwise."""
    torch = importlib.import_module("torch")  # deferred: only a server given vectors reads them

    try:
        if path.endswith(".npy"):
            import numpy as np

            value: Any = np.load(path)
        elif path.endswith(".safetensors"):
            from safetensors.torch import load_file

            tensors = load_file(path)
            if len(tensors) != 1:
                raise ValueError(f"it holds {len(tensors)} tensors, not one")
            value = next(iter(tensors.values()))
        elif path.endswith(".json"):
            with open(path) as f:
                value = json.load(f)
        else:
            value = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, ValueError, RuntimeError) as error:
        refuse(f"{parameter}: cannot read {path!r} ({error}).", parameter, path)
    vector = to_tensor(value, parameter).flatten()
    if vector.shape[0] != width or not torch.isfinite(vector).all():
        refuse(f"{parameter}: {path!r} must hold {width} finite numbers (the model's hidden "
               f"size), got {vector.shape[0]}.", parameter, path)
    return vector
