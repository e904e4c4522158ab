"""`notebook_setup()`: the first cell of a notebook, one line.

It quiets transformers' warnings, seeds torch and loads the model as an `LLM` (a progress bar
while it loads) in float32, the dtype whose greedy tokens are the same on every CPU, so a
notebook's stored outputs hold on other machines. Extra keywords go to `LLM` (`EngineConfig`).

>>> import workbench                                      # doctest: +SKIP
>>> llm = workbench.notebook_setup()                      # doctest: +SKIP
>>> llm                                                   # doctest: +SKIP
LLM('smollm2-135m-instruct', generate, float32 on cpu, max_model_len=8192, seed=0)
"""

from __future__ import annotations

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
    return LLM(model=model, dtype=dtype, seed=seed, **engine_kwargs)
