"""`notebook_setup()`: the first cell of a notebook, one line.

It quiets transformers' warnings, seeds torch and loads the model as an `LLM` (progress bars
while it loads, cleared once it has: a saved notebook holds no stale `0%| 0/3` bar) in float32, the dtype whose greedy tokens are the same on every CPU, so a
notebook's stored outputs hold on other machines. Extra keywords go to `LLM` (`EngineConfig`).

>>> import workbench                                      # doctest: +SKIP
>>> llm = workbench.notebook_setup()                      # doctest: +SKIP
>>> llm                                                   # doctest: +SKIP
LLM('smollm2-135m-instruct', generate, float32 on cpu, max_model_len=8192, seed=0)
"""

from __future__ import annotations

import sys
from typing import Any

import torch  # at the top: the package root imports this module only for notebook_setup
from transformers.utils import logging as hf_logging

from workbench.llm import LLM

DEFAULT_MODEL = "smollm2-135m-instruct"


def notebook_setup(model: str = DEFAULT_MODEL, *, dtype: str = "float32", seed: int = 0,
                   **engine_kwargs: Any):
    """Quiet transformers' warnings, seed torch, load `model`; returns the `LLM`."""
    hf_logging.set_verbosity_error()  # keeps its progress bars, drops its warnings
    torch.manual_seed(seed)
    llm = LLM(model=model, dtype=dtype, seed=seed, **engine_kwargs)
    _clear_progress()
    return llm


def _clear_progress() -> None:
    """Clears the cell's output (the loading bars) when a notebook kernel runs it."""
    ipython = sys.modules.get("IPython")  # loaded wherever a kernel runs; never imported here
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is not None:
        from IPython.display import clear_output

        clear_output()
