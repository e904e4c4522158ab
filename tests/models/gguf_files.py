"""Tiny GGUF files written from a transformers model, the way llama.cpp's converter writes them.

`write_gguf(model, path, "Q8_0")` names each tensor with gguf-py's own name map, undoes what
transformers' GGUF loader will redo (Llama's Q/K head permutation, Bloom's per-head fused QKV,
GPT-2's [in, out] Conv1D weights; a fused MoE `gate_up_proj` is split into llama.cpp's stacked
`ffn_gate_exps` / `ffn_up_exps`), quantizes every 2-D or 3-D tensor whose rows split into whole blocks
(Q4_0, Q4_1 and Q8_0 with gguf-py's quantizer; the K-quants, which gguf-py cannot quantize, as
random but finite blocks) and writes the metadata transformers reads back into a config
(`GGUF_CONFIG_MAPPING`, plus a placeholder vocabulary). No tokenizer is written: the file loads
with `AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)`, not with a tokenizer class.
`dequantize(weight)` is the float32 reference for a `QuantizedWeight`, from gguf-py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast

import gguf
import numpy as np
import torch
from transformers import PreTrainedModel
from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

from workbench.models.gguf_blocks import BLOCK_TYPES, QuantizedWeight

K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
# llama.cpp's architecture names where they are not the model type
_GGUF_ARCH = {"mistral": "llama", "gemma3_text": "gemma3", "qwen2_moe": "qwen2moe"}
_CONFIG_KEYS = {"gemma3_text": "gemma3"}  # their entries of GGUF_CONFIG_MAPPING
_EXPERTS = re.compile(r".*layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)")
_SCALE_OFFSETS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # bytes of each block's f16 scales


def write_gguf(model: PreTrainedModel, path: str | Path, kind: str = "Q8_0", *,
               seed: int = 0, skip_keys: tuple[str, ...] = ()) -> Path:
    """Write `model` (a transformers causal LM) as the GGUF file `path`, 2-D weights as `kind`
    (a key of `BLOCK_TYPES`, or "F16" / "F32"), 3-D experts too; 1-D tensors, and those whose
    rows do not split into whole blocks, as F32. `skip_keys` leaves out metadata keys
    ("attention.head_count_kv"), as older files do."""
    path = Path(path)
    config = model.config
    arch = config.model_type
    writer = gguf.GGUFWriter(str(path), _GGUF_ARCH.get(arch, arch))
    if arch == "mistral":
        writer.add_name("tiny-mistral")  # how transformers tells Mistral from a llama file
    _write_metadata(writer, config, skip_keys)
    name_map = gguf.get_tensor_name_map(_model_arch(_GGUF_ARCH.get(arch, arch)),
                                        config.num_hidden_layers)
    rng = np.random.default_rng(seed)
    tied = getattr(config, "tie_word_embeddings", False)
    for hf_name, value in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue  # llama.cpp writes no output.weight for a tied head
        for gguf_name, array in _llama_cpp_tensors(hf_name, value.float().numpy(), name_map,
                                                   config):
            _add_tensor(writer, gguf_name, array, kind, rng)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def dequantize(weight: QuantizedWeight) -> torch.Tensor:
    """gguf-py's float32 dequantization of `weight`: [out_features, in_features]."""
    qtype = gguf.GGMLQuantizationType[weight.kind]
    return torch.from_numpy(gguf.quants.dequantize(weight.data.numpy(), qtype))


def _llama_cpp_tensors(hf_name: str, array: np.ndarray, name_map: gguf.TensorNameMap,
                       config) -> list[tuple[str, np.ndarray]]:
    """The tensor(s) llama.cpp's converter writes for the parameter `hf_name`."""
    if experts := _EXPERTS.fullmatch(hf_name):  # transformers' fused experts: [E, rows, K]
        layer, which = experts.groups()
        if which == "down_proj":
            return [(f"blk.{layer}.ffn_down_exps.weight", array)]
        gate, up = np.split(array, 2, axis=1)  # gate_up_proj: gate's rows first
        return [(f"blk.{layer}.ffn_gate_exps.weight", gate),
                (f"blk.{layer}.ffn_up_exps.weight", up)]
    base, suffix = hf_name.rsplit(".", 1)
    gguf_name = _gguf_name(name_map, base)
    if gguf_name is None:
        raise ValueError(f"gguf-py has no {config.model_type} name for {hf_name!r}")
    if gguf_name.endswith(".ffn_gate_inp_shexp"):
        array = array.reshape(-1)  # llama.cpp squeezes the shared expert's gate [1, H]
    return [(f"{gguf_name}.{suffix}", _as_llama_cpp(gguf_name, array, config))]


def _gguf_name(name_map: gguf.TensorNameMap, base: str) -> str | None:
    """gguf-py's name for the module `base`, trying it without its leading prefixes too (Bloom's
    map names `word_embeddings_layernorm`, its causal LM `transformer.word_embeddings_layernorm`)."""
    parts = base.split(".")
    for start in range(len(parts)):
        if (name := name_map.get_name(".".join(parts[start:]))) is not None:
            return name
    return None


def _model_arch(arch: str) -> gguf.MODEL_ARCH:
    for key, name in gguf.MODEL_ARCH_NAMES.items():
        if name == arch:
            return key
    raise ValueError(f"gguf-py knows no architecture {arch!r}")


def _write_metadata(writer: gguf.GGUFWriter, config, skip_keys: tuple[str, ...]) -> None:
    """The keys transformers maps back onto `config`'s fields, and a placeholder vocabulary."""
    arch = config.model_type
    prefix = _GGUF_ARCH.get(arch, arch)
    mapping = cast(dict[str, str | None], GGUF_CONFIG_MAPPING[_CONFIG_KEYS.get(arch, arch)])
    for gguf_key, field in mapping.items():
        value = _config_value(config, field) if field else None
        if isinstance(value, bool) or value is None or gguf_key in skip_keys:
            continue
        value_type = gguf.GGUFValueType.UINT32 if isinstance(value, int) else gguf.GGUFValueType.FLOAT32
        writer.add_key_value(f"{prefix}.{gguf_key}", value, value_type)
    # the vocabulary size of the families whose mapping has no `vocab_size` key (gpt2, starcoder2)
    writer.add_token_list([f"<{i}>" for i in range(config.vocab_size)])
    for role in ("bos", "eos", "padding"):
        token_id = getattr(config, f"{role.replace('padding', 'pad')}_token_id", None)
        if isinstance(token_id, int):
            writer.add_uint32(f"tokenizer.ggml.{role}_token_id", token_id)


def _config_value(config, field: str):
    if field in ("rope_theta",):
        return (getattr(config, "rope_parameters", None) or {}).get(field)
    return getattr(config, field, None)


def _as_llama_cpp(gguf_name: str, array: np.ndarray, config) -> np.ndarray:
    """What llama.cpp's converter does to a tensor, which transformers' GGUF loader undoes."""
    arch = config.model_type
    if arch in ("llama", "mistral") and (".attn_q." in gguf_name or ".attn_k." in gguf_name):
        heads = config.num_attention_heads
        if ".attn_k." in gguf_name:
            heads = config.num_key_value_heads
        return (array.reshape(heads, 2, array.shape[0] // heads // 2, *array.shape[1:])
                .swapaxes(1, 2).reshape(array.shape))
    if arch == "bloom" and ".attn_qkv." in gguf_name:
        heads, width = config.n_head, config.hidden_size
        per_head = array.reshape(heads, 3, width // heads, *array.shape[1:])  # HF: q, k, v per head
        return np.concatenate([per_head[:, i].reshape(width, *array.shape[1:]) for i in range(3)])
    if arch == "gpt2" and gguf_name.split(".")[-1] in ("attn_qkv", "attn_output", "ffn_up",
                                                       "ffn_down") and array.ndim == 2:
        return np.ascontiguousarray(array.T)  # Conv1D's [in, out] as [out, in]
    return array


def _add_tensor(writer: gguf.GGUFWriter, name: str, array: np.ndarray, kind: str,
                rng: np.random.Generator) -> None:
    if kind in ("F32", "F16"):
        writer.add_tensor(name, array.astype(np.float16 if kind == "F16" and array.ndim >= 2
                                             else np.float32))
        return
    block = BLOCK_TYPES[kind]
    if array.ndim < 2 or array.shape[-1] % block.block_size:
        writer.add_tensor(name, array.astype(np.float32))
        return
    qtype = gguf.GGMLQuantizationType[kind]
    if kind in K_QUANTS:
        rows = _random_blocks(kind, array.size // array.shape[-1], array.shape[-1], rng)
        data = rows.reshape(*array.shape[:-1], rows.shape[-1])
    else:
        data = gguf.quants.quantize(array.astype(np.float32), qtype)
    writer.add_tensor(name, data, raw_dtype=qtype)


def _random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random `kind` blocks with small positive f16 scales, so every weight is finite."""
    block = BLOCK_TYPES[kind]
    blocks = rng.integers(0, 256, (rows, cols // block.block_size, block.block_bytes),
                          dtype=np.uint8)
    for offset in _SCALE_OFFSETS[kind]:
        scales = rng.uniform(1e-3, 1e-2, blocks.shape[:2]).astype(np.float16)
        blocks[:, :, offset:offset + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)
