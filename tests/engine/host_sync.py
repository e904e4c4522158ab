"""`forbid_host_sync()`: a CPU stand-in for `torch.cuda.set_sync_debug_mode("error")`.

On a GPU, a host sync is any operator whose result the host must read before it can go on: a
tensor's value turned into a Python number or list (`.item()`, `bool()`, `int()`, `.tolist()`,
`.numpy()`), or an operator whose output size depends on the data (`nonzero`, boolean-mask
indexing, `masked_select`, `unique`, `repeat_interleave` without its output size). Inside the
context each of them raises `HostSync`, whatever the device: the Python conversions through
patched `torch.Tensor` methods, the operators as torch dispatches them (a `TorchDispatchMode`),
so code that passes here on the CPU launches no sync on the GPU either.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_SYNCING_OPS = frozenset({"_local_scalar_dense", "nonzero", "nonzero_static", "masked_select",
                          "_unique", "_unique2", "unique_dim", "unique_consecutive", "item",
                          "is_nonzero", "equal"})
_CONVERSIONS = ("item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__")


class HostSync(AssertionError):
    """An operation that would make the host wait for the device."""


class _Watch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in _SYNCING_OPS:
            raise HostSync(f"host sync: {func}")
        if name == "index" and any(i is not None and i.dtype == torch.bool
                                   for i in args[1]):
            raise HostSync(f"host sync: {func} with a boolean mask")
        if name == "repeat_interleave" and kwargs.get("output_size") is None:
            raise HostSync(f"host sync: {func} without output_size")
        return func(*args, **kwargs)


def _refuse(name: str):
    def refused(self, *args, **kwargs):
        raise HostSync(f"host sync: Tensor.{name}()")
    return refused


@contextmanager
def forbid_host_sync() -> Iterator[None]:
    """Raises `HostSync` at the first operation inside that would sync a GPU with the host."""
    with mock.patch.multiple(torch.Tensor, **{name: _refuse(name) for name in _CONVERSIONS}), \
            _Watch():
        yield
