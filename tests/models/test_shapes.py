"""The random models in real layer shapes (`workbench.models.shapes`): checkpoints other tools
read as they read a published one."""

from __future__ import annotations

import json

from transformers import AutoConfig

from workbench.models import shapes


def test_a_checkpoint_names_its_class(tmp_path):
    """config.json names the model class (`architectures`), as a published checkpoint does:
    vLLM and llama.cpp's converter pick the architecture from it."""
    config = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=256, bos_token_id=1,
                                  eos_token_id=2, pad_token_id=2)
    shapes.write_checkpoint(config, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == ["LlamaForCausalLM"]
    assert AutoConfig.from_pretrained(tmp_path).architectures == ["LlamaForCausalLM"]


def test_a_checkpoint_gives_its_rotary_base_top_level(tmp_path):
    """config.json has `rope_theta` at the top, as published Llama checkpoints do (transformers
    5 writes it inside `rope_parameters` only, and llama.cpp's converter refuses such a file),
    and transformers reads the same rotary parameters back."""
    config = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=256, rope_theta=500000.0)
    shapes.write_checkpoint(config, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["rope_theta"] == 500000.0
    assert AutoConfig.from_pretrained(tmp_path).rope_parameters == config.rope_parameters
