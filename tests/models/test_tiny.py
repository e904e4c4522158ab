"""tiny_model: small random models of each architecture with a real tokenizer."""

import pytest
import torch

from workbench.models import TINY_ARCHITECTURES, tiny_model


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_tiny_decoders_run_a_forward_pass_over_real_text(arch):
    lm = tiny_model(arch, seed=0)
    ids = lm.tokenizer("Once upon a time", return_tensors="pt")["input_ids"]  # [1, T]
    logits = lm.model(ids).logits  # [1, T, V]
    assert logits.shape == (1, ids.shape[1], 49152)
    assert torch.isfinite(logits).all()
    assert (lm.kind, lm.config.model_type, lm.config.num_hidden_layers) == ("generate", arch, 2)
    assert lm.tokenizer.chat_template and lm.eos_token_ids == [2]


def test_tiny_bert_embeds_with_the_minilm_tokenizer():
    lm = tiny_model("bert", seed=0)
    batch = lm.tokenizer(["hello world"], return_tensors="pt")
    assert batch["input_ids"][0, 0] == lm.tokenizer.cls_token_id
    assert lm.model(**batch).last_hidden_state.shape == (1, batch["input_ids"].shape[1], 64)
    assert (lm.kind, lm.pooling) == ("embed", "mean")


def test_same_seed_same_weights_other_seed_other_weights():
    first, again, other = (tiny_model("llama", seed=s).model.state_dict() for s in (0, 0, 1))
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_building_does_not_touch_the_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_model("qwen2", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_model_in_bfloat16():
    lm = tiny_model("mistral", dtype="bfloat16")
    assert lm.dtype is torch.bfloat16 and lm.model.dtype is torch.bfloat16


def test_unknown_architecture_is_refused():
    with pytest.raises(ValueError, match="'gpt5'"):
        tiny_model("gpt5")
    assert "llama" in TINY_ARCHITECTURES


@pytest.mark.parametrize("arch, model", [("llama", "smollm2-135m-instruct"),
                                         ("bert", "all-minilm-l6-v2")])
def test_shipped_tokenizers_equal_the_real_models(arch, model):
    """The tokenizers in workbench/models/tokenizers/ are the real models' (same ids, special
    tokens and chat template), so tiny tests need neither model package."""
    from transformers import AutoTokenizer

    from workbench.models.registry import resolve_model

    try:
        path = resolve_model(model).path
    except (ValueError, FileNotFoundError):
        pytest.skip(f"{model} is not installed here")
    real = AutoTokenizer.from_pretrained(path, local_files_only=True)
    shipped = tiny_model(arch).tokenizer
    texts = ["Once upon a time", "naïve café — 東京 🙂", "<|im_start|>user\nhi<|im_end|>"]
    assert [shipped(t)["input_ids"] for t in texts] == [real(t)["input_ids"] for t in texts]
    assert (shipped.eos_token_id, shipped.pad_token_id, shipped.bos_token_id) == \
        (real.eos_token_id, real.pad_token_id, real.bos_token_id)
    assert shipped.chat_template == real.chat_template
    assert len(shipped) == len(real)
