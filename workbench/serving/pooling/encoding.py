"""Pooled tensors -> response values: floats, or base64 of their raw bytes.

`encoding_format="base64"` is the bytes of the values in `embed_dtype` (float32 by default;
float16, bfloat16, fp8_e4m3, fp8_e5m2) with the requested `endianness` ("native" = this machine's, little-endian on x86 and ARM
servers), as the reference sends them; OpenAI's client decodes it with
`np.frombuffer(base64.b64decode(s), dtype="float32")`, so a float32 base64 embedding decodes to
exactly the floats of `encoding_format="float"`.

>>> import torch
>>> encode(torch.tensor([1.0, -2.0]), "base64", "float32", "little")
'AACAPwAAAMA='
>>> encode(torch.tensor([1.0, -2.0]), "float")
[1.0, -2.0]
"""

from __future__ import annotations

import base64
import sys
from typing import Any

import numpy as np

_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16",
           "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def tensor_bytes(data: Any, embed_dtype: str = "float32", endianness: str = "native") -> bytes:
    """The raw bytes of `data` (a tensor) in `embed_dtype` with the given byte order."""
    import torch  # deferred: torch is heavy; only binary encodings need it

    tensor = data.detach().to("cpu").contiguous()
    if embed_dtype not in _DTYPES:
        raise ValueError(f"embed_dtype {embed_dtype!r} is not supported")
    tensor = tensor.to(getattr(torch, _DTYPES[embed_dtype]))
    width = tensor.element_size()
    raw = tensor.reshape(-1).view(torch.uint8).numpy()  # native byte order
    order = sys.byteorder if endianness == "native" else endianness
    if order != sys.byteorder:
        raw = raw.reshape(-1, width)[:, ::-1]
    return np.ascontiguousarray(raw).tobytes()


def encode(data: Any, encoding_format: str = "float", embed_dtype: str = "float32",
           endianness: str = "native") -> Any:
    """A pooled tensor as the response carries it: nested floats, a float, or base64."""
    if encoding_format == "base64":
        return base64.b64encode(tensor_bytes(data, embed_dtype, endianness)).decode("ascii")
    return data.detach().to("cpu").float().tolist()


def encode_outputs(request: Any, outputs: list[Any]) -> list[Any]:
    """Each pooled output of a batch encoded as `request` asks (format, dtype, byte order)."""
    return [encode(out.outputs.data, request.encoding_format, request.embed_dtype,
                   request.endianness) for out in outputs]
