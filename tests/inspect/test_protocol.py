"""Every inspect object is an `Inspectable`: `to_dict`, `to_frame`, `plot`, `_repr_html_`,
checked on a small real instance of each class `workbench.inspect` exports."""

from __future__ import annotations

import json

import pytest
import torch

import workbench.inspect as inspect_pkg
from workbench.inspect import Inspectable
from workbench.inspect import branch_tree as bt
from workbench.inspect import divergence as dv
from workbench.inspect.trace import Span
from workbench.serving.recorder import Check

NOT_OBJECTS = {"Inspectable", "BeamNode", "remote_beam_search"}  # the protocol, a record, a function


def _table(tokens: list[str], logprobs: list[float]):
    tops = [{t: lp, "x": lp - 1.0} for t, lp in zip(tokens, logprobs)]
    body = {"choices": [{"index": 0, "text": "".join(tokens), "logprobs": {
        "tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops}}]}
    return inspect_pkg.LogprobTable.from_completion(body)


def _instances() -> dict[str, object]:
    i = inspect_pkg
    beam_tree = i.BeamTree([1], 1, 1.0, [i.BeamNode(0, 1, 5, "a", -0.1, -0.1, None, 1, "kept",
                                                    -0.1)], [0])
    a, b = _table(["A", "b"], [-0.1, -0.5]), _table(["A", "c"], [-0.2, -0.9])
    original = bt.Path((bt.PathToken(5, "A", -0.1, ((5, -0.1), (6, -2.5))),
                        bt.PathToken(7, " b", -0.5)), "A b", "length")
    branch_tree = i.BranchTree([1, 2], original, [bt.Branch(0, bt.Path(
        (bt.PathToken(6, "C", -2.5), bt.PathToken(8, " d", None)), "C d", "length"), 16)])
    response = {"id": "resp_1", "status": "completed", "output": [
        {"type": "function_call", "call_id": "c", "name": "calculator",
         "arguments": json.dumps({"expression": "6*7"})},
        {"type": "function_call_output", "call_id": "c", "output": "42"},
        {"type": "message", "content": [{"type": "output_text", "text": "42."}]}]}
    alone = dv.Scenario("alone", dv.RunTokens((1, 2), ("A", " b"), (-0.1, -0.5),
                                              margins=(2.0, 0.004)), "A b", 0, 0, 1)
    batch = dv.Scenario("batch", dv.RunTokens((1, 3), ("A", " c"), (-0.1, -0.6)), "A c", 0,
                        2, 3, 2)
    divergence = i.DivergenceReport(alone, [batch, dv.Scenario("warm", alone.tokens, "A b")])
    return {
        "BeamTree": beam_tree, "DivergenceReport": divergence, "BranchTree": branch_tree, "LogprobTable": a, "LogprobDiff": a.diff(b),
        "ValidationReport": i.ValidationReport("completions", (
            Check("model", "check model", "passed"), Check("user", "validate", "ignored", "user"))),
        "Trace": i.Trace((Span("validate", "pipeline", 0.0, 0.001),
                          Span("decode", "engine", 0.001, 0.01))),
        "ParsedOutput": i.ParsedOutput.from_tokens(["<think>", "hm", "</think>", "Hi"],
                                                   logprobs=[-0.1, -0.2, -0.3, -0.4],
                                                   reasoning_parser="deepseek_r1"),
        "ToolLoopTrace": i.ToolLoopTrace.from_response(response),
        "SimilarityMatrix": i.SimilarityMatrix(["q"], ["a", "b"], [[0.25, 0.75]], "score"),
        "ActivationCache": i.ActivationCache(
            tokens=["a", "b"], num_layers=1, positions=[0, 1], tensors={
                "blocks.0.hook_resid_post": torch.ones(2, 3),
                "blocks.0.attn.hook_pattern": torch.tensor([[[1.0, 0.0], [0.5, 0.5]]])}),
        "AttentionPattern": i.AttentionPattern(0, [0], torch.tensor([[[1.0, 0.0], [0.5, 0.5]]]),
                                               [0, 1], ["a", "b"]),
        "ModelComparison": i.ModelComparison.from_body({
            "model": "m", "tokens": ["A", " b"], "token_ids": [5, 7], "variants": [
                {"name": "base", "logprobs": [-0.1, -0.5], "kl": [0.0, 0.0]},
                {"name": "lora", "logprobs": [-0.3, -0.2], "kl": [0.05, 0.1]}]}),
        "LogitLens": i.LogitLens(tokens=["a", "b"], layers=[0], positions=[0, 1],
                                 top_ids=torch.tensor([[[1], [2]]]),
                                 top_probs=torch.tensor([[[0.5], [0.9]]]),
                                 top_tokens=[[["b"], ["c"]]]),
        "FeatureActivations": i.FeatureActivations(
            tokens=["a", "b", "c"], sae="s", hook_name="blocks.0.hook_resid_post", d_sae=8,
            positions=[0, 1], top_ids=torch.tensor([[3, 1], [5, 3]]),
            top_values=torch.tensor([[2.0, 0.5], [1.0, 0.0]]), indices=[3],
            values=torch.tensor([[2.0], [0.0]]), l0=[2, 1], error_norm=[0.1, 0.2]),
    }


INSTANCES = _instances()


def test_every_exported_inspect_class_has_an_instance_here():
    assert set(inspect_pkg.__all__) - NOT_OBJECTS == set(INSTANCES)


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_the_class_and_its_instance_satisfy_the_protocol(name):
    obj = INSTANCES[name]
    assert type(obj) is getattr(inspect_pkg, name)
    assert isinstance(obj, Inspectable)
    json.dumps(obj.to_dict(), default=str)
    assert len(obj.to_frame()) > 0
    html = obj._repr_html_()
    assert html == obj._repr_html_() and html.startswith("<")


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_plot_draws_on_the_given_axes(name):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    try:
        assert INSTANCES[name].plot(ax=ax) is ax
        assert ax.has_data() or ax.images
    finally:
        plt.close(fig)


def test_a_non_inspect_object_is_not_inspectable():
    assert not isinstance({"to_dict": 1}, Inspectable)
    assert not isinstance(Span("a", "pipeline", 0.0, 1.0), Inspectable)


def test_old_names_still_work():
    sim, table = INSTANCES["SimilarityMatrix"], INSTANCES["LogprobTable"]
    assert sim.frame().equals(sim.to_frame())
    assert type(table).heatmap is type(table).plot


def _gappy() -> dict[str, object]:
    """Instances whose frames have gaps: no logprobs, a call-less round, a check without a
    parameter, a child of the prompt."""
    i = inspect_pkg
    response = {"id": "resp_2", "status": "completed", "output": [
        {"type": "message", "content": [{"type": "output_text", "text": "hi"}]}]}
    return {**INSTANCES,
            "ParsedOutput": i.ParsedOutput.from_tokens(["a", " b"]),
            "ToolLoopTrace": i.ToolLoopTrace.from_response(response)}


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_frames_mark_every_missing_value_as_pandas_na(name):
    import math

    import pandas as pd

    frame = _gappy()[name].to_frame().reset_index()
    for column in frame.columns:
        cells = list(frame[column])
        assert not any(v is None or (isinstance(v, float) and math.isnan(v)) for v in cells), \
            (name, column, cells)
        present = [v for v in cells if v is not pd.NA]
        if len(present) < len(cells) and present and frame[column].dtype == object:
            assert not all(isinstance(v, (bool, int, float, str)) for v in present), \
                f"{name}.{column}: a plain column left as objects, not a nullable dtype"


def test_gaps_are_typed_na_in_nullable_columns():
    import pandas as pd

    frames = {k: v.to_frame() for k, v in _gappy().items()}
    assert frames["ParsedOutput"]["logprob"].dtype == "Float64"  # typed though all missing
    assert frames["ParsedOutput"]["logprob"].isna().all()
    assert frames["ValidationReport"]["param"].dtype == "string"
    assert frames["ValidationReport"]["param"][0] is pd.NA
    loop = frames["ToolLoopTrace"]
    assert loop["tool"][0] is pd.NA and loop["builtin"].dtype == "boolean"
    assert loop["priority"].dtype == "Int64"
    assert str(frames["LogprobTable"]["rank"].dtype) == "Int64"
    assert frames["BeamTree"]["parent"].dtype == "Int64"
