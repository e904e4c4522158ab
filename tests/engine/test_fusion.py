"""Fused Q/K/V and gate/up projections compute what the separate linears did."""

import copy

import pytest
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
    fuse_projections(packed, kernel="onednn")
    assert isinstance(packed.lm_head, FastLinear) and packed.lm_head.kernel == "onednn"
    assert isinstance(packed.model.layers[0].mlp.down_proj, FastLinear)
    ids = lm.tokenizer("The quick brown fox jumps", return_tensors="pt").input_ids
    with torch.inference_mode():
        assert torch.equal(packed(ids).logits, lm.model(ids).logits)


def _needs_mkl():
    from workbench.engine import mkl

    if not mkl.available():
        import pytest

        pytest.skip("this torch build does not export MKL's bf16 GEMM")


@pytest.mark.parametrize("rows", [1, 3])
def test_mkl_products_equal_float32_arithmetic_rounded_once(rows):
    """One row goes through MKL's bf16 GEMM, more through oneDNN: both accumulate in fp32 and
    round once, so each output is within one bf16 rounding of the exact product."""
    from workbench.engine.fusion import FastLinear

    _needs_mkl()
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=gen).to(torch.bfloat16)
    bias = torch.randn(96, generator=gen).to(torch.bfloat16)
    x = torch.randn(1, rows, 64, generator=gen).to(torch.bfloat16)
    linear = FastLinear(weight, bias, "mkl")
    got = linear(x)
    exact = x.float() @ weight.float().T + bias.float()
    assert got.shape == (1, rows, 96) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), exact, rtol=2 ** -8, atol=1e-3)
    reference = torch.nn.functional.linear(x, weight, bias)  # oneDNN
    assert (got != reference).float().mean() < 0.02  # at most a last-bit difference, rarely


def test_the_tied_lm_head_shares_the_embedding_weight():
    _needs_mkl()
    lm = tiny_model("llama", dtype="bfloat16")
    model = copy.deepcopy(lm.model)
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        pytest.skip("the tiny llama does not tie its embeddings")
    fuse_projections(model, kernel="mkl")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_mkl_kernel_keeps_the_model_close_to_transformers():
    """The whole tiny model with MKL projections: logits within bf16 noise of transformers'."""
    _needs_mkl()
    lm = tiny_model("qwen2", dtype="bfloat16")  # with q/k/v biases
    fast = copy.deepcopy(lm.model)
    fuse_projections(fast, kernel="mkl")
    ids = lm.tokenizer("The quick brown fox jumps", return_tensors="pt").input_ids
    with torch.inference_mode():
        last = fast(ids[:, :1]).logits  # one row: MKL
        whole = fast(ids).logits  # five rows: oneDNN
        torch.testing.assert_close(last.float(), lm.model(ids[:, :1]).logits.float(),
                                   rtol=0.02, atol=0.02)
        torch.testing.assert_close(whole.float(), lm.model(ids).logits.float(), rtol=0.02,
                                   atol=0.02)
