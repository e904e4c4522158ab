"""`ComparePlan` and its variants without a model: what each facade takes as a variant, the
requests of each variant, and the comparison assembled from hand-made outputs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from workbench.errors import ValidationError
from workbench.inspect.scoring import ScoredSpan
from workbench.lora.request import LoRARequest
from workbench.serving.compare import Variant
from workbench.verbs.compare import (
    ComparePlan,
    offline_variant,
    variants_of_body,
    workbench_variant,
)

SPAN = ScoredSpan([1, 2, 3, 2], 2)  # the text: tokens 3, 2


def test_an_offline_variant_is_none_an_adapter_or_a_dict():
    pirate = LoRARequest("pirate", 1, "/adapters/pirate")
    assert offline_variant(None, "m") == Variant("m", "m", None, None)
    assert offline_variant(pirate, "m") == Variant("pirate", "pirate", pirate, None)
    assert offline_variant({"interventions": ["x"]}, "m").name == "m + interventions"
    with pytest.raises(TypeError, match="got str"):
        offline_variant("pirate", "m")
    with pytest.raises(ValidationError, match=r"got \['model'\]"):
        offline_variant({"model": "x"}, "m")


def test_a_workbench_variant_is_a_body_entry():
    serve = lambda lora: f"served-{lora.lora_name}"  # noqa: E731
    pirate = LoRARequest("pirate", 1, "/adapters/pirate")
    assert workbench_variant(None, 0, serve) == {}
    assert workbench_variant("other", 0, serve) == {"model": "other"}
    assert workbench_variant(pirate, 0, serve) == {"model": "served-pirate"}
    assert workbench_variant({"lora_request": pirate, "name": "p"}, 0, serve) == {
        "model": "served-pirate", "name": "p"}
    with pytest.raises(ValidationError) as info:
        workbench_variant(3, 2, serve)
    assert info.value.parameter == "variants[2]"


def test_a_server_that_is_not_ours_takes_no_interventions():
    body = {"variants": [{}, {"model": "b"}], "reference": 0}
    assert [v.name for v in variants_of_body(body, "a", "http://x/v1")] == ["a", "b"]
    with pytest.raises(ValidationError, match="http://x/v1 is not one") as info:
        variants_of_body({"variants": [{}, {"interventions": [1]}], "reference": 0}, "a",
                         "http://x/v1")
    assert info.value.parameter == "variants[1].interventions"
    with pytest.raises(ValidationError, match="must differ"):
        variants_of_body({"variants": [{}, {}], "reference": 0}, "a", "http://x/v1")


def test_the_requests_of_each_variant():
    plan = ComparePlan.of([Variant("a", "a"), Variant("b", "b")], SPAN, 1, "a")
    params = plan.params(vocab_size=4)
    assert [(p.prompt_logprobs, p.prompt_distributions_from, p.max_tokens) for p in params] == [
        (0, 2, 1)] * 2
    assert plan.bodies() == [{"prompt": [[1, 2, 3, 2]], "max_tokens": 1, "temperature": 0,
                              "prompt_logprobs": 1, "model": m} for m in ("a", "b")]
    with pytest.raises(ValidationError, match="reference must be"):
        ComparePlan.of([Variant("a", "a"), Variant("b", "b")], SPAN, 2, "a")


def test_the_exact_comparison_from_each_variant_s_output():
    def output(logits):
        dist = torch.log_softmax(torch.tensor(logits), -1)
        rows = [None, None] + [{t: SimpleNamespace(logprob=float(dist[i, t]), rank=1)}
                               for i, t in enumerate((3, 2))]
        return SimpleNamespace(prompt_distributions=dist, prompt_logprobs=rows)

    same = [[0.0, 0.0, 1.0, 2.0], [0.0, 0.0, 3.0, 1.0]]
    plan = ComparePlan.of([Variant("a", "a"), Variant("b", "b")], SPAN, 0, "a")
    comparison = plan.assemble([output(same), output(same)], lambda t: f"<{t}>")
    body = comparison.to_dict()
    assert body["tokens"] == ["<3>", "<2>"] and body["prompt_tokens"] == 2
    assert [v["kl"] for v in body["variants"]] == [[0.0, 0.0], [0.0, 0.0]]
    assert body["variants"][1]["argmax_ids"] == [3, 2]
