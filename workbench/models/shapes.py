"""Random models in the layer shapes of the models researchers study, built once into the cache.

Speed and memory depend on a model's shapes, not on its weights' values, so `random-llama-1b`,
`random-gemma2-2b` and `random-llama-8b` (`SHAPES`: Llama-3.2-1B's, Gemma-2-2B's and
Llama-3.1-8B's layers, hidden sizes, heads and MLP widths) stand in for the real checkpoints
where no hub is reachable: what the bench measures at size (`workbench bench --shape
llama-1b`), what `workbench serve --model random-llama-8b` serves. Their vocabulary is
SmolLM2's (its tokenizer ships in this package: 49,152 tokens, not the real models' 128,256 or
256,000), their context 8,192 positions (no long-context RoPE scaling), their weights bfloat16
drawn from N(0, 0.02) with seed 0 (norms at their identity), so outputs are noise.

`shape_dir(name)` writes the safetensors shards (at most `SHARD_BYTES` each) one tensor at a
time, so building the 8B model (14.8 GB) holds one tensor in memory, not the model; it is
built at most once into `$WORKBENCH_CACHE/models/random-NAME/` (`cache.prepared_dir`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import MappingProxyType
from typing import Any

from workbench.models.cache import model_cache_dir, prepared_dir

_LLAMA3 = dict(model_type="llama", num_key_value_heads=8, rope_theta=500000.0,
               hidden_act="silu", rms_norm_eps=1e-5)
# name -> the config fields that make the shape (the rest: tokenizer, context, ids)
SHAPES: MappingProxyType[str, dict[str, Any]] = MappingProxyType({
    "llama-1b": dict(_LLAMA3, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, head_dim=64, tie_word_embeddings=True),
    "gemma2-2b": dict(model_type="gemma2", hidden_size=2304, intermediate_size=9216,
                      num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=256, query_pre_attn_scalar=256, sliding_window=4096,
                      attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                      hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
    "llama-8b": dict(_LLAMA3, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, head_dim=128, tie_word_embeddings=False),
})
CONTEXT = 8192
SHARD_BYTES = 2 * 2**30
SEED = 0
_TOKENIZER = Path(__file__).with_name("tokenizers") / "smollm2"


def alias(name: str) -> str:
    """The model alias of shape `name` (`random-llama-1b`)."""
    return f"random-{name}"


def config_of(name: str):
    """The transformers config of shape `name`."""
    from transformers import AutoConfig, AutoTokenizer  # deferred: heavy, and only here

    if name not in SHAPES:
        raise ValueError(f"Unknown shape {name!r}; choose one of {tuple(SHAPES)}.")
    tokenizer = AutoTokenizer.from_pretrained(_TOKENIZER, local_files_only=True)
    fields = dict(SHAPES[name])
    return AutoConfig.for_model(
        fields.pop("model_type"), **fields, vocab_size=len(tokenizer),
        max_position_embeddings=CONTEXT, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        torch_dtype="bfloat16")


def parameters_of(config) -> list[tuple[str, tuple[int, ...]]]:
    """Every weight a checkpoint of `config` holds, (name, shape), in the model's order: the
    model built on the meta device (no memory), a tied weight once."""
    import torch  # deferred: the aliases import this module, torch-free
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(config)
    return [(name, tuple(p.shape)) for name, p in net.named_parameters()]


def random_weight(name: str, shape: tuple[int, ...], model_type: str, generator):
    """A bfloat16 weight: a norm at its identity (Gemma's norms scale by 1 + w: zeros), a bias
    zero, any other N(0, 0.02) from `generator`."""
    import torch

    if len(shape) == 1:
        gemma = model_type.startswith("gemma")
        identity = "norm" in name and not gemma
        return (torch.ones if identity else torch.zeros)(shape, dtype=torch.bfloat16)
    return (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)


def write_checkpoint(config, target: Path, log=None) -> None:
    """`config`'s random bfloat16 weights as safetensors shards (with their index) in `target`,
    one tensor in memory at a time; `config.json` and `generation_config.json` beside them."""
    import torch
    from safetensors.torch import save_file
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    params = parameters_of(config)
    total = sum(2 * torch.Size(shape).numel() for _, shape in params)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in params:
        nbytes = 2 * torch.Size(shape).numel()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    generator = torch.Generator().manual_seed(SEED)
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: random_weight(name, shape, config.model_type, generator)
                   for name, shape in shard}
        save_file(tensors, target / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in tensors})
        del tensors
        if log:
            log(f"wrote {file}")
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (target / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    # the class a checkpoint names, as `save_pretrained` of a model writes it: what vLLM and
    # llama.cpp's `convert_hf_to_gguf.py` read to pick the architecture
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    config.save_pretrained(target)
    # transformers 5 writes the rotary base inside `rope_parameters` only; published
    # checkpoints (and llama.cpp's converter, which reads nothing else) have it top-level too
    path = target / "config.json"
    fields = json.loads(path.read_text())
    theta = (fields.get("rope_parameters") or {}).get("rope_theta")
    if theta is not None and "rope_theta" not in fields:
        path.write_text(json.dumps({**fields, "rope_theta": theta}, indent=2,
                                   sort_keys=True) + "\n")
    (target / "generation_config.json").write_text(json.dumps({
        "bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id}, indent=2) + "\n")


def shape_dir(name: str, log=None) -> Path:
    """The directory of shape `name`'s random model, built on first use (see the module
    docstring)."""
    config = config_of(name)

    def build(tmp: Path) -> None:
        write_checkpoint(config, tmp, log)
        for file in _TOKENIZER.iterdir():
            shutil.copy(file, tmp / file.name)

    source = {"shape": name, "fields": dict(SHAPES[name]), "context": CONTEXT, "seed": SEED}
    return prepared_dir(model_cache_dir(alias(name)), source, build)
