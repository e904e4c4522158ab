"""Reads and checks a PEFT LoRA adapter: `adapter_config.json` + `adapter_model.safetensors`.

`load_adapter(request, modules, max_rank, dtype, device)` returns a `LoRAAdapter` whose weights
are keyed by the model's module names (`model.layers.3.self_attn.q_proj`) and already cast to
the model's dtype, or raises `LoRALoadError` (a `ValidationError`: a 400 over HTTP) saying what
is wrong: no such directory (`LoRANotFoundError`, a 404), unreadable or corrupt files, a type
other than LoRA, a rank above `max_lora_rank`, a target module the model lacks, a shape that
does not fit, non-finite weights, or PEFT options this engine does not apply (DoRA, biases,
`modules_to_save`, rank / alpha patterns) — refused by name, never silently dropped.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from workbench.errors import ValidationError
from workbench.lora.request import LoRARequest

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."


class LoRALoadError(ValidationError):
    """An adapter that cannot be used; the message says why."""

    def __init__(self, request: LoRARequest, reason: str):
        super().__init__(f"Loading lora {request.lora_name} failed: {reason}",
                         parameter="lora_request")
        self.reason = reason


class LoRANotFoundError(LoRALoadError):
    """No adapter at the path (vLLM answers 404 for it)."""


@dataclass
class LoRAAdapter:
    """A loaded adapter: per module `(A [r, in], B [out, r])` and its scaling."""

    request: LoRARequest
    rank: int
    scaling: float
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]
    config: dict[str, Any]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())

    @property
    def target_modules(self) -> list[str]:
        """The distinct module kinds it adapts, e.g. ["q_proj", "v_proj"]."""
        return sorted({name.rsplit(".", 1)[-1] for name in self.weights})


def read_config(request: LoRARequest) -> dict[str, Any]:
    """The adapter's config, checked; raises `LoRALoadError`."""
    path = Path(request.lora_path).expanduser()
    if not request.lora_path or not (path / CONFIG_FILE).is_file():
        raise LoRANotFoundError(request, f"No adapter found for {request.lora_path}")
    try:
        config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoRALoadError(request, f"{CONFIG_FILE} is not valid JSON ({exc}).") from exc
    if not isinstance(config, dict):
        raise LoRALoadError(request, f"{CONFIG_FILE} must hold a JSON object.")
    peft_type = config.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise LoRALoadError(request, f"peft_type {peft_type!r} is not supported; only LoRA "
                                     "adapters are.")
    refused = {
        "use_dora": "DoRA adapters are not supported",
        "lora_bias": "LoRA biases are not supported",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D) adapters are not supported",
        "modules_to_save": "modules_to_save (fully trained extra modules) is not supported",
        "rank_pattern": "per-module ranks (rank_pattern) are not supported",
        "alpha_pattern": "per-module alphas (alpha_pattern) are not supported",
        "layer_replication": "layer_replication is not supported",
    }
    for key, message in refused.items():
        if config.get(key):
            raise LoRALoadError(request, f"{message} ({key}={config[key]!r}).")
    if config.get("bias", "none") != "none":
        raise LoRALoadError(request, f"bias={config['bias']!r} is not supported (only 'none').")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise LoRALoadError(request, f"r must be a positive integer, got {rank!r}.")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise LoRALoadError(request, f"lora_alpha must be a number, got {alpha!r}.")
    return config


def load_adapter(request: LoRARequest, modules: dict[str, tuple[int, int]], max_rank: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> LoRAAdapter:
    """Loads and checks the adapter at `request.lora_path` against the model's adaptable
    `modules` (name -> (in_features, out_features)); see the module docstring."""
    config = read_config(request)
    rank = config["r"]
    if rank > max_rank:
        raise LoRALoadError(request, f"LoRA rank {rank} is greater than max_lora_rank "
                                     f"{max_rank}.")
    path = Path(request.lora_path).expanduser()
    weights_file = path / WEIGHTS_FILE
    if not weights_file.is_file():
        found = "adapter_model.bin (pickle) is not supported: save with safetensors" if (
            path / "adapter_model.bin").is_file() else "it is missing"
        raise LoRALoadError(request, f"{WEIGHTS_FILE}: {found}.")
    try:
        tensors = load_file(str(weights_file), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise LoRALoadError(request, f"{WEIGHTS_FILE} could not be read ({exc}).") from exc
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        name = key.removeprefix(_PREFIX)
        for part in ("lora_A", "lora_B"):
            suffix = f".{part}.weight"
            if name.endswith(suffix):
                pairs.setdefault(name[:-len(suffix)], {})[part] = tensor
                break
        else:
            raise LoRALoadError(request, f"unexpected tensor {key!r} (only lora_A / lora_B "
                                         "weights of linear layers are supported).")
    if not pairs:
        raise LoRALoadError(request, f"{WEIGHTS_FILE} holds no LoRA weights.")
    supported = sorted({m.rsplit(".", 1)[-1] for m in modules})
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, pair in sorted(pairs.items()):
        if name not in modules:
            leaf = name.rsplit(".", 1)[-1]
            why = ("does not exist in the model" if leaf in supported else
                   f"is not supported (supported: {', '.join(supported)})")
            raise LoRALoadError(request, f"target module {name} {why}.")
        if set(pair) != {"lora_A", "lora_B"}:
            missing = ({"lora_A", "lora_B"} - set(pair)).pop()
            raise LoRALoadError(request, f"{name} has no {missing} weight.")
        a, b = pair["lora_A"], pair["lora_B"]
        in_features, out_features = modules[name]
        if a.dim() != 2 or b.dim() != 2 or tuple(a.shape) != (rank, in_features) or \
                tuple(b.shape) != (out_features, rank):
            raise LoRALoadError(
                request, f"{name}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit "
                f"(expected [{rank}, {in_features}] and [{out_features}, {rank}]): the adapter "
                "was made for another model or another rank.")
        if not (a.is_floating_point() and b.is_floating_point()):
            raise LoRALoadError(request, f"{name}: weights must be floating point, got {a.dtype}.")
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise LoRALoadError(request, f"{name}: weights contain NaN or infinity.")
        weights[name] = (a.to(device=device, dtype=dtype).contiguous(),
                         b.to(device=device, dtype=dtype).contiguous())
    alpha = config.get("lora_alpha", 8)
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return LoRAAdapter(request=request, rank=rank, scaling=float(scaling), weights=weights,
                       config=config)
