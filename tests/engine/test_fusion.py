"""Fused Q/K/V and gate/up projections compute what the separate linears did."""

import copy

import torch

from workbench.engine.fusion import FusedPart, fuse_projections
from workbench.models import tiny_model


def test_fusion_replaces_every_projection_group():
    model = copy.deepcopy(tiny_model("llama").model)
    assert fuse_projections(model) == 2 * model.config.num_hidden_layers
    attn = model.model.layers[0].self_attn
    assert all(isinstance(getattr(attn, n), FusedPart) for n in ("q_proj", "k_proj", "v_proj"))


def test_fused_model_gives_the_same_logits():
    lm = tiny_model("qwen2")  # q/k/v with biases
    fused = copy.deepcopy(lm.model)
    fuse_projections(fused)
    ids = lm.tokenizer("The quick brown fox", return_tensors="pt").input_ids
    with torch.inference_mode():
        expected = lm.model(ids).logits
        got = fused(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_part_called_alone_computes_its_own_slice():
    lm = tiny_model("llama")
    k_weight = lm.model.model.layers[0].self_attn.k_proj.weight.detach().clone()
    model = copy.deepcopy(lm.model)
    fuse_projections(model)
    x = torch.randn(1, 3, lm.config.hidden_size)
    k = model.model.layers[0].self_attn.k_proj(x)  # no q_proj call before it
    torch.testing.assert_close(k, x @ k_weight.T, rtol=1e-5, atol=1e-5)


def test_prepacked_bf16_projections_are_bit_identical():
    from workbench.engine.fusion import FastLinear, can_prepack

    lm = tiny_model("llama", dtype="bfloat16")
    if not can_prepack(next(lm.model.parameters())):
        import pytest

        pytest.skip("this torch build has no oneDNN prepacking")
    packed = copy.deepcopy(lm.model)
    fuse_projections(packed, prepack=True)
    assert isinstance(packed.lm_head, FastLinear) and packed.lm_head.prepacked
    assert isinstance(packed.model.layers[0].mlp.down_proj, FastLinear)
    ids = lm.tokenizer("The quick brown fox jumps", return_tensors="pt").input_ids
    with torch.inference_mode():
        assert torch.equal(packed(ids).logits, lm.model(ids).logits)
