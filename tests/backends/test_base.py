"""`Backend`: both of the Workbench's back ends implement the declared protocol, method by
method, with the protocol's parameters (checked on the classes, and on live instances in
`tests/backends/test_local_and_remote.py`'s style: a tiny model in the kernel and over HTTP)."""

from __future__ import annotations

import inspect

import pytest

from workbench.backends.base import Backend
from workbench.backends.local import _Local
from workbench.backends.remote import _Remote

METHODS = ["generate", "generate_many", "stream", "call", "respond", "stream_respond", "pooling",
           "compare", "validate", "beam_search", "tokenizer", "close"]


def test_the_protocol_declares_the_eleven_methods_a_workbench_calls():
    declared = {name for name, value in vars(Backend).items()
                if inspect.isfunction(value) and not name.startswith("_")}
    assert declared == set(METHODS)


@pytest.mark.parametrize("cls", [_Local, _Remote])
@pytest.mark.parametrize("name", METHODS)
def test_each_backend_defines_each_method_with_the_protocols_parameters(cls, name):
    assert name in vars(cls), f"{cls.__name__}.{name} is only the protocol's"
    ours = list(inspect.signature(getattr(cls, name)).parameters)
    assert ours == list(inspect.signature(getattr(Backend, name)).parameters)


def test_a_remote_backend_is_a_backend_without_a_server():
    backend = _Remote("http://127.0.0.1:9/v1", None, 1.0)  # no request until used
    backend._model = "m"  # the check reads `model`, which would ask the server's /models
    try:
        assert isinstance(backend, Backend)
    finally:
        backend.close()


def test_a_local_backend_is_a_backend(tiny_llama):
    from tests.engine.helpers import make_llm

    backend = _Local(make_llm(tiny_llama), None)
    try:
        assert isinstance(backend, Backend) and isinstance(backend.model, str)
    finally:
        backend.close()
