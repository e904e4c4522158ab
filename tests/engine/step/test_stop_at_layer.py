"""`SamplingParams.stop_at_layer` (TransformerLens's): a request whose forward ends before a
layer records what the layers before compute, bit for bit what the whole forward records, and
computes nothing after: no later layer writes its KV, no LM head runs, no token is sampled.
What would need the layers or the logits it skips is refused, naming the field."""

from __future__ import annotations

import pytest
import torch

from tests.engine.helpers import make_llm
from workbench.errors import ValidationError
from workbench.models.tiny import tiny_model
from workbench.sampling_params import SamplingParams

PROMPT = "one two three four five six seven eight nine ten"


def capture(stop: int | None = None, **extra) -> SamplingParams:
    """A prompt's rows of layer 0's sites and layer 1's residual stream (its pattern too)."""
    spec = {"sites": ["blocks.0.hook_attn_out", "blocks.0.hook_mlp_out",
                      "blocks.1.hook_resid_post", "blocks.1.attn.hook_pattern"]}
    return SamplingParams(temperature=0, max_tokens=1, capture=spec, stop_at_layer=stop,
                          **extra)


# llama, qwen2 and gemma2 run the engine's own layer loop, gpt2 and granite transformers'
# layers through hooks
@pytest.mark.parametrize("family, lean", [("llama", True), ("qwen2", True), ("gemma2", True),
                                          ("gpt2", False), ("granite", False)])
def test_a_stopped_forward_records_the_whole_forwards_bits_and_computes_nothing_after(
        family, lean, monkeypatch):
    loaded = tiny_model(family, num_hidden_layers=4)
    llm = make_llm(loaded)
    runner = llm.llm_engine.runner
    assert (runner.stack is not None) == lean
    whole = llm.generate([PROMPT], capture())[0]
    llm.llm_engine.block_manager.reset_prefix_cache()
    for k, v in runner.kv_caches:
        k.zero_()
        v.zero_()

    def no_logits(hidden):
        raise AssertionError("the LM head ran")

    monkeypatch.setattr(runner, "logits", no_logits)
    stopped = llm.generate([PROMPT], capture(2))[0]
    assert stopped.finished and stopped.outputs[0].token_ids == []
    assert stopped.outputs[0].finish_reason == "stop_at_layer"
    assert list(stopped.activations) == list(whole.activations)
    for name in whole.activations:
        assert torch.equal(stopped.activations[name], whole.activations[name]), name
    written = [bool(k.any()) for k, _ in runner.kv_caches]
    assert written == [True, True, False, False]  # layers 2 and 3 never ran


def test_beside_other_requests_every_one_gets_its_own_answer():
    """A step that also serves a whole request runs every layer: the stopped request's rows
    are the same, it still ends with its prompt, and the other request's tokens are its own
    alone (batch invariance makes both the same bits however they share the step)."""
    llm = make_llm(tiny_model("llama", num_hidden_layers=4), batch_invariant=True)
    plain = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    alone_plain = llm.generate([PROMPT], plain)[0]
    alone_stopped = llm.generate([PROMPT], capture(2))[0]
    llm.llm_engine.block_manager.reset_prefix_cache()
    stopped, other = llm.generate([PROMPT, "the cat sat on the"], [capture(2), plain])
    assert stopped.outputs[0].token_ids == [] and len(other.outputs[0].token_ids) == 6
    assert other.outputs[0].token_ids == llm.generate(["the cat sat on the"], plain)[0] \
        .outputs[0].token_ids
    for name in alone_stopped.activations:
        assert torch.equal(stopped.activations[name], alone_stopped.activations[name])
    assert alone_plain.outputs[0].token_ids  # the engine goes on serving


def test_its_blocks_never_serve_a_later_prompt_from_the_prefix_cache():
    """Its later layers' KV was never written: a whole request on the same prompt computes
    every position itself, and gets the tokens of an engine that never saw the stopped one."""
    llm = make_llm(tiny_model("llama", num_hidden_layers=4))
    fresh = make_llm(tiny_model("llama", num_hidden_layers=4))
    plain = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate([PROMPT * 3], capture(2))
    after = llm.generate([PROMPT * 3], plain)[0]
    assert after.num_cached_tokens == 0
    assert after.outputs[0].token_ids == fresh.generate([PROMPT * 3], plain)[0] \
        .outputs[0].token_ids


def test_negative_layers_count_from_the_end_and_the_lens_reads_the_layers_before():
    llm = make_llm(tiny_model("llama", num_hidden_layers=4))
    lens = {"layers": [1], "top_k": 3}
    whole = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1,
                                                  logit_lens=lens))[0]
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1, logit_lens=lens,
                                                stop_at_layer=-2))[0]
    assert out.outputs[0].finish_reason == "stop_at_layer"
    assert out.logit_lens.to_frame().equals(whole.logit_lens.to_frame())


@pytest.mark.parametrize("kwargs, parameter", [
    ({"stop_at_layer": 2, "max_tokens": 16, "capture": ["resid_post"]}, "max_tokens"),
    ({"stop_at_layer": 2, "max_tokens": 1, "capture": ["blocks.0.hook_resid_post"],
      "logprobs": 1}, "logprobs"),
    ({"stop_at_layer": 2, "max_tokens": 1, "capture": ["blocks.0.hook_resid_post"],
      "prompt_logprobs": 0}, "prompt_logprobs"),
    ({"stop_at_layer": 2, "max_tokens": 1}, "stop_at_layer"),
    ({"stop_at_layer": 2, "max_tokens": 1,  # it would return nothing
      "interventions": [{"site": "blocks.0.hook_resid_post", "op": "zero"}]}, "stop_at_layer"),
    ({"stop_at_layer": True, "max_tokens": 1, "capture": ["blocks.0.hook_resid_post"]},
     "stop_at_layer"),
])
def test_what_needs_the_logits_is_refused_naming_the_field(kwargs, parameter):
    with pytest.raises(ValidationError) as err:
        SamplingParams(temperature=0, **kwargs)
    assert err.value.parameter == parameter


@pytest.mark.parametrize("stop, asks, parameter", [
    (2, {"capture": ["blocks.2.hook_resid_pre"]}, "capture.sites"),
    (2, {"capture": ["ln_final.hook_normalized"]}, "capture.sites"),
    (2, {"capture": {"sites": ["resid_post"]}}, "capture.sites"),  # every layer
    (2, {"logit_lens": {"layers": [3]}}, "logit_lens.layers"),
    (2, {"capture": ["blocks.0.hook_resid_post"],
         "interventions": [{"site": "blocks.3.hook_resid_post", "op": "zero"}]},
     "interventions[0]"),
    (0, {"capture": ["blocks.0.hook_resid_pre"]}, "stop_at_layer"),
    (5, {"capture": ["blocks.0.hook_resid_pre"]}, "stop_at_layer"),
    (-4, {"capture": ["blocks.0.hook_resid_pre"]}, "stop_at_layer"),
])
def test_what_the_stopped_forward_never_computes_is_refused_naming_the_field(
        stop, asks, parameter):
    llm = make_llm(tiny_model("llama", num_hidden_layers=4))
    with pytest.raises(ValidationError) as err:
        llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=1, stop_at_layer=stop,
                                              **asks))
    assert err.value.parameter == parameter
    assert "stop_at_layer" in err.value.message or parameter == "stop_at_layer"
