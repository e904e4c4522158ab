"""A model ready to run: weights in eval mode on a device, its tokenizer and config.

`load_model(name)` resolves the name (alias, directory, .gguf file, cached hub id), loads the
weights with transformers from local files only, and returns a `LoadedModel`. Generative models
load as `AutoModelForCausalLM`, embedding models as `AutoModel` plus their pooling settings
(from the sentence-transformers files when the directory has them).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from workbench.errors import ValidationError
from workbench.models.architectures import architecture_of, module_at
from workbench.models.devices import resolve_device, resolve_dtype
from workbench.models.gguf_blocks import QuantizedWeight
from workbench.models.registry import ENCODER_TYPES, resolve_model

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class LoadedModel:
    """A loaded model and what the engine needs beside it.

    `model` is in eval mode with gradients off; `kind` is "generate" or "embed"; `path` is the
    directory it came from (None for a model built in memory). `pooling` ("mean" | "cls" |
    "max" | "last") and `normalize` say how an embedding model turns its hidden states into
    one vector. `quantized` (with `dtype="gguf"`): the GGUF file's blocks of every weight it
    holds quantized, by parameter name; the model itself is then the float32 dequantization
    (what the blocks are tested against, and the weights that stay float: norms, embeddings).
    """

    model: torch.nn.Module
    tokenizer: Any
    config: Any
    path: Path | None
    served_name: str
    kind: str
    dtype: torch.dtype
    device: str
    max_model_len: int | None = None
    pooling: str | None = None
    normalize: bool = False
    quantized: dict[str, QuantizedWeight] | None = None
    weights_dtype: torch.dtype | None = None  # bfloat16 where `bf16_weights` kept them so

    @property
    def eos_token_ids(self) -> list[int]:
        """Every token id that ends a generation: the generation config's, then the tokenizer's."""
        ids = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in ids:
            ids.append(self.tokenizer.eos_token_id)
        return ids

    @property
    def num_parameters(self) -> int:
        """The number of distinct parameters (tied weights count once)."""
        return sum(p.numel() for p in self.model.parameters())

    def __repr__(self) -> str:
        dtype = "gguf" if self.quantized else str(self.dtype).removeprefix("torch.")
        if self.weights_dtype is not None:
            dtype += f" ({str(self.weights_dtype).removeprefix('torch.')} weights)"
        return (f"LoadedModel({self.served_name!r}, kind={self.kind!r}, dtype={dtype}, "
                f"device={self.device!r}, params={self.num_parameters / 1e6:.1f}M)")


def load_model(model: str | Path, *, dtype: str | torch.dtype = "auto", device: str = "auto",
               kind: str | None = None, served_name: str | None = None,
               progress: bool = True, bf16_weights: bool = False) -> LoadedModel:
    """Load a model by alias, directory, .gguf file or cached hub id.

    `dtype` and `device` accept "auto" (see `resolve_dtype`, `resolve_device`); `dtype="gguf"`
    keeps a GGUF model's quantized blocks (`LoadedModel.quantized`) beside its float32
    dequantization, on the CPU. `progress`
    shows the stages (weights, tokenizer, device) as a tqdm bar: a widget in a notebook, a line
    on the terminal. `bf16_weights` (the engine's, where its float32 kernel reads bfloat16
    weights): a generative model in float32 on the CPU whose checkpoint is bfloat16 keeps its
    decoder layers' linear weights, LM head and input embedding in bfloat16 as the checkpoint
    has them (mapped, not converted: half the bytes, loaded at the disk's speed), everything
    else widened to float32; it computes in float32 on the same values (`compute_dtype`).
    """
    # deferred: transformers is heavy to import and only loading needs it
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    spec = resolve_model(model, kind=kind, served_name=served_name)
    if spec.kind == "generate":  # a family the engine cannot run exactly: refused before its weights
        architecture_of(AutoConfig.from_pretrained(spec.path, local_files_only=True))
    device = resolve_device(device)
    gguf = dtype == "gguf"
    if gguf:
        _check_gguf(spec, device)
    torch_dtype = torch.float32 if gguf else resolve_dtype(dtype, device)
    keep_bf16 = (bf16_weights and not gguf and spec.kind == "generate" and device == "cpu"
                 and torch_dtype == torch.float32
                 and checkpoint_dtype(spec.path) == torch.bfloat16)
    auto_class = AutoModelForCausalLM if spec.kind == "generate" else AutoModel
    with tqdm(total=3, desc=f"Loading {spec.served_name}", unit="stage",
              disable=not progress) as stages:
        stages.set_postfix_str("weights")
        net, info = auto_class.from_pretrained(
            spec.path, dtype=torch.bfloat16 if keep_bf16 else torch_dtype,
            local_files_only=True, output_loading_info=True)
        _check_complete(spec.served_name, info)
        if keep_bf16:
            _widen_all_but_projections(net)
        stages.update()
        stages.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(spec.path, local_files_only=True)
        stages.update()
        stages.set_postfix_str(f"to {device}")
        net = prepare_for_inference(net, device)
        stages.update()
        stages.set_postfix_str("ready")
    pooling, normalize = pooling_of(spec.path, net.config) if spec.kind == "embed" else (None, False)
    quantized = None
    if gguf and spec.gguf is not None:
        # deferred: reading a GGUF file's blocks (gguf-py) is needed for dtype="gguf" only
        from workbench.models.gguf_read import quantized_summary, read_quantized

        quantized = read_quantized(spec.gguf, net)
        logger.info("%s (%s): %s", spec.served_name, spec.gguf.name,
                    quantized_summary(quantized))
    return LoadedModel(model=net, tokenizer=tokenizer, config=net.config, path=spec.path,
                       served_name=spec.served_name, kind=spec.kind, dtype=torch_dtype,
                       device=device, max_model_len=max_model_len_of(spec.path, net.config),
                       pooling=pooling, normalize=normalize, quantized=quantized,
                       weights_dtype=torch.bfloat16 if keep_bf16 else None)


COMPUTE_DTYPE = "workbench_compute_dtype"  # a model attribute: the dtype it computes in


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype `model` computes in: float32 for one loaded with `bf16_weights` (its
    projections' weights bfloat16, its activations float32), else its first parameter's."""
    return getattr(model, COMPUTE_DTYPE, None) or next(model.parameters()).dtype


def checkpoint_dtype(path: Path | None) -> torch.dtype | None:
    """The one floating dtype of every tensor in the directory's safetensors files (None:
    none there, several dtypes, or a header that does not read)."""
    names = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    found: set[str] = set()
    for file in sorted(Path(path).glob("*.safetensors")) if path else ():
        try:
            with open(file, "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        except (OSError, ValueError):
            return None
        found |= {entry["dtype"] for key, entry in header.items()
                  if key != "__metadata__" and entry.get("dtype") in names}
    return names[found.pop()] if len(found) == 1 else None


def _widen_all_but_projections(net: torch.nn.Module) -> None:
    """A bfloat16 model made to compute in float32, widening only what no kernel reads: the
    decoder layers' `nn.Linear` weights, the LM head's and the input embedding's stay bfloat16
    (the float32 kernel widens each exactly as it reads it; the embedding's rows are widened
    as they are looked up), every other parameter and buffer becomes float32 (exact: bf16 is
    float32's top half). `compute_dtype(net)` then says float32."""
    layers = module_at(net, architecture_of(net.config).layers)
    kept = {id(m.weight) for m in layers.modules() if type(m) is torch.nn.Linear}
    for m in (net.get_output_embeddings(), net.get_input_embeddings()):
        if m is not None and getattr(m, "weight", None) is not None:
            kept.add(id(m.weight))
    for module in net.modules():
        for param in list(module.parameters(recurse=False)):
            if id(param) not in kept and param.is_floating_point():
                param.data = param.data.float()
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.is_floating_point():
                setattr(module, name, buffer.float())
    net.get_input_embeddings().register_forward_hook(lambda _m, _args, out: out.float())
    setattr(net, COMPUTE_DTYPE, torch.float32)


def _check_complete(name: str, info: dict[str, Any]) -> None:
    """Refuses a checkpoint that lacks some of the model's weights: transformers would fill them
    with random values (and a warning), a model that computes noise, differently in every
    process."""
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        raise ValueError(f"{name}: the checkpoint lacks {len(missing)} of the model's weights "
                         f"({shown}); refusing to fill them with random values.")


def _check_gguf(spec, device: str) -> None:
    """`dtype="gguf"` needs a generative model converted from a GGUF file, on the CPU."""
    where = None
    if spec.gguf is None:
        where = (f"a model converted from a GGUF file (an alias of one, or a .gguf path); "
                 f"{spec.name!r} is not")
    elif spec.kind != "generate":
        where = "a generative model"
    elif device != "cpu":
        where = f"the CPU (its blocks are multiplied in C there), not {device}"
    if where is not None:
        raise ValidationError(f"dtype 'gguf' (the file's quantized blocks) needs {where}.",
                              parameter="dtype", value="gguf")


def prepare_for_inference(net: torch.nn.Module, device: str) -> torch.nn.Module:
    """Move to `device`, switch to eval mode, turn gradients off."""
    net = net.to(device).eval()
    net.requires_grad_(False)
    return net


def max_model_len_of(path: Path | None, config: Any) -> int | None:
    """The longest sequence the model takes: sentence-transformers' limit, else the config's."""
    st_config = _read_json(path, "sentence_bert_config.json") if path else None
    if st_config and st_config.get("max_seq_length"):
        return int(st_config["max_seq_length"])
    return getattr(config, "max_position_embeddings", None)


def pooling_of(path: Path | None, config: Any) -> tuple[str, bool]:
    """(pooling, normalize) from a sentence-transformers directory, else a default by model."""
    modules = (_read_json(path, "modules.json") or []) if path else []
    for module in modules:
        if module.get("type", "").endswith("Pooling"):
            pooling_config = _read_json(path / module.get("path", ""), "config.json") or {}
            normalize = any(m.get("type", "").endswith("Normalize") for m in modules)
            return _pooling_mode(pooling_config), normalize
    return ("cls" if getattr(config, "model_type", None) in ENCODER_TYPES else "last"), True


def _pooling_mode(pooling_config: dict) -> str:
    for key, mode in (("pooling_mode_mean_tokens", "mean"), ("pooling_mode_cls_token", "cls"),
                      ("pooling_mode_lasttoken", "last"), ("pooling_mode_max_tokens", "max")):
        if pooling_config.get(key):
            return mode
    return "mean"


def _read_json(path: Path, filename: str) -> Any:
    try:
        return json.loads((Path(path) / filename).read_text())
    except (OSError, ValueError):
        return None
