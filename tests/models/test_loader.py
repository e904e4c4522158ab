"""load_model: the real models, and any local directory, ready for inference."""

import pytest
import torch

from workbench.models import load_model


@pytest.mark.slow
def test_default_model_loads_in_eval_mode_without_gradients(default_model):
    assert (default_model.kind, default_model.served_name) == ("generate", "smollm2-135m-instruct")
    assert default_model.dtype is torch.float32 and default_model.device == "cpu"
    assert not default_model.model.training
    assert not any(p.requires_grad for p in default_model.model.parameters())
    assert default_model.max_model_len == 8192
    assert default_model.eos_token_ids == [2]


@pytest.mark.slow
def test_default_model_answers_a_chat_question(default_model):
    tokenizer = default_model.tokenizer
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    out = default_model.model.generate(ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1]:])


def test_embedding_model_loads_with_its_pooling():
    lm = load_model("all-minilm-l6-v2", dtype="float32")
    assert (lm.kind, lm.pooling, lm.normalize, lm.max_model_len) == ("embed", "mean", True, 256)
    batch = lm.tokenizer(["a cat sat on the mat", "a kitten sat on a rug", "stock prices fell"],
                         padding=True, return_tensors="pt")
    hidden = lm.model(**batch).last_hidden_state  # [B, T, 384]
    mask = batch["attention_mask"].unsqueeze(-1)
    vectors = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > similarity[0, 2] + 0.2


def test_local_directory_loads_the_same_weights(tmp_path):
    from workbench.models import tiny_model

    tiny_llama = tiny_model("llama", seed=0)  # unpatched: an engine fuses the shared fixture's
    path = tmp_path / "tiny-dir"
    tiny_llama.model.save_pretrained(path)
    tiny_llama.tokenizer.save_pretrained(path)
    lm = load_model(str(path), dtype="float32")
    assert (lm.served_name, lm.kind, lm.path) == ("tiny-dir", "generate", path.resolve())
    ids = lm.tokenizer("Hello world", return_tensors="pt")["input_ids"]
    torch.testing.assert_close(lm.model(ids).logits, tiny_llama.model(ids).logits)


def test_dtype_is_applied(tiny_llama_dir):
    lm = load_model(tiny_llama_dir, dtype="bfloat16", served_name="tiny")
    assert lm.dtype is torch.bfloat16 and lm.model.dtype is torch.bfloat16
    assert lm.served_name == "tiny"
    assert "dtype=bfloat16" in repr(lm)


def test_a_checkpoint_lacking_weights_is_refused(tmp_path):
    """transformers would fill a missing weight with random values (a warning in a log); we
    refuse the checkpoint, naming what it lacks."""
    from safetensors.torch import load_file, save_file

    from workbench.models import tiny_model

    tiny = tiny_model("llama", seed=0)
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks 1 of the model's weights "
                                         r"\(model\.layers\.1\.mlp\.up_proj\.weight\)"):
        load_model(tmp_path, dtype="float32")
