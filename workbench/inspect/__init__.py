"""Inspect objects: each an `Inspectable` (`to_dict()`, `to_frame()`, `plot()`, `_repr_html_`).

`BeamTree` (every candidate of a beam search), `BranchTree` (an output and its branches, each
forced at a position to another token), `DivergenceReport` (one request alone, batched and cached:
where its bits part), `LogprobTable`, `LogprobDiff`, `ModelComparison`
(variants of a model on the same tokens: Δ logprob and KL),
`ValidationReport`, `Trace`, `ParsedOutput`, `ToolLoopTrace`, `SimilarityMatrix`, the views of
what a request saw inside the model (`ActivationCache`, `AttentionPattern`, `LogitLens`,
`FeatureActivations`), and the
client-side `remote_beam_search` over any OpenAI-compatible server. Names load lazily, so
importing `workbench.inspect` pulls in neither pandas nor matplotlib.
"""

from __future__ import annotations

import importlib

_NAMES = {
    "BeamTree": "workbench.inspect.beam_tree",
    "BeamNode": "workbench.inspect.beam_tree",
    "BranchTree": "workbench.inspect.branch_tree",
    "DivergenceReport": "workbench.inspect.divergence",
    "remote_beam_search": "workbench.inspect.remote_beam",
    "LogprobTable": "workbench.inspect.logprob_table",
    "LogprobDiff": "workbench.inspect.logprob_diff",
    "ModelComparison": "workbench.inspect.model_compare",
    "Inspectable": "workbench.inspect.protocol",
    "ValidationReport": "workbench.inspect.validation_report",
    "Trace": "workbench.inspect.trace",
    "ParsedOutput": "workbench.inspect.parsed_output",
    "ToolLoopTrace": "workbench.inspect.tool_loop",
    "SimilarityMatrix": "workbench.inspect.similarity",
    # what a request saw inside the model (the data: `workbench.inside.recorded`)
    "ActivationCache": "workbench.inspect.activations",
    "AttentionPattern": "workbench.inspect.attention_pattern",
    "LogitLens": "workbench.inspect.logit_lens",
    "FeatureActivations": "workbench.inspect.features",
}


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench.inspect' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_NAMES)
