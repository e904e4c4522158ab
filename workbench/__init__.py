"""workbench: vLLM's OpenAI server and offline API, reimplemented on torch + transformers.

>>> import workbench
>>> workbench.__version__
'0.1.0'

The public names load lazily, so `import workbench` stays fast and does not import torch:
`LLM`, `SamplingParams`, `BeamSearchParams`, `RequestOutputKind`, `serve_in_kernel`,
`Workbench`, `LoRARequest`, `StructuredOutputsParams`, `PoolingParams`, and
`notebook_setup` (a notebook's first cell).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from workbench.version import __version__

if TYPE_CHECKING:
    from workbench.http.kernel_server import serve_in_kernel
    from workbench.llm import LLM
    from workbench.lora.request import LoRARequest
    from workbench.notebook import notebook_setup
    from workbench.pooling_params import PoolingParams
    from workbench.sampling_params import (
        BeamSearchParams,
        RequestOutputKind,
        SamplingParams,
        StructuredOutputsParams,
    )
    from workbench.workbench import Workbench

_LAZY = {
    "LLM": "workbench.llm",
    "SamplingParams": "workbench.sampling_params",
    "BeamSearchParams": "workbench.sampling_params",
    "RequestOutputKind": "workbench.sampling_params",
    "StructuredOutputsParams": "workbench.sampling_params",
    "serve_in_kernel": "workbench.http.kernel_server",
    "Workbench": "workbench.workbench",
    "LoRARequest": "workbench.lora.request",
    "PoolingParams": "workbench.pooling_params",
    "notebook_setup": "workbench.notebook",
}

__all__ = ["BeamSearchParams", "LLM", "LoRARequest", "PoolingParams", "RequestOutputKind",
           "SamplingParams",
           "StructuredOutputsParams",
           "Workbench",
           "__version__", "notebook_setup", "serve_in_kernel"]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
