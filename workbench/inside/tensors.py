"""Arrays over HTTP: `{"dtype", "shape", "data"}`, the bytes little-endian in base64.

Exact (the bits of the tensor, not decimal text) and a third the size of a JSON list of
floats. `dtype` is numpy's name (`float32`, `int64`, ...); bfloat16, which numpy lacks, is sent
as float32 (every bfloat16 is one, exactly). A request's inline vector may use the same form
(`workbench.inside.vectors`). A sparse tensor (COO, as a capture's `sparse` SAE features are)
is `{"sparse": "coo", "shape", "indices", "values"}`, its indices [dims, nnz] and values
[nnz] each in the form above.

>>> import torch
>>> wire = encode_tensor(torch.tensor([[1.5, -2.0]]))
>>> wire["dtype"], wire["shape"], decode_tensor(wire).tolist(), decode_array(wire).dtype.name
('float32', [1, 2], [[1.5, -2.0]], 'float32')
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import torch

DTYPES = ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")


def encode_tensor(tensor: Any) -> dict[str, Any]:
    """A tensor (or array) in wire form (see the module docstring)."""
    t = torch.as_tensor(tensor).detach().cpu()
    if t.is_sparse:
        t = t.coalesce()
        return {"sparse": "coo", "shape": list(t.shape), "indices": encode_tensor(t.indices()),
                "values": encode_tensor(t.values())}
    if t.dtype == torch.bfloat16:
        t = t.float()
    array = np.ascontiguousarray(t.numpy())
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return {"dtype": array.dtype.name, "shape": list(array.shape),
            "data": base64.b64encode(little.tobytes()).decode("ascii")}


def decode_tensor(wire: dict[str, Any]) -> torch.Tensor:
    """The tensor of a wire form; a ValueError names what is wrong with it."""
    if isinstance(wire, dict) and "sparse" in wire:
        if wire["sparse"] != "coo":
            raise ValueError(f"sparse layout {wire['sparse']!r} is not 'coo'")
        try:
            indices, values = decode_tensor(wire["indices"]), decode_tensor(wire["values"])
            shape = [int(s) for s in wire["shape"]]
            return torch.sparse_coo_tensor(indices, values, shape, is_coalesced=True,
                                           check_invariants=True)
        except (KeyError, TypeError, RuntimeError) as error:
            raise ValueError(f"a sparse wire tensor is {{sparse, shape, indices, values}}: "
                             f"{error}") from error
    return torch.from_numpy(decode_array(wire))


def decode_array(wire: dict[str, Any]) -> np.ndarray:
    """The numpy array of a wire form (native byte order, writable)."""
    try:
        if wire["dtype"] not in DTYPES:
            raise ValueError(f"dtype {wire['dtype']!r} is not one of {', '.join(DTYPES)}")
        dtype = np.dtype(wire["dtype"]).newbyteorder("<")
        shape = [int(s) for s in wire["shape"]]
        array = np.frombuffer(base64.b64decode(wire["data"], validate=True), dtype=dtype)
        array = array.reshape(shape)
    except (KeyError, TypeError) as error:
        raise ValueError(f"a wire tensor is {{dtype, shape, data}}: {error}") from error
    return array.astype(array.dtype.newbyteorder("="), copy=True)
