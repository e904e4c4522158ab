"""Adapters made on the spot with peft, and transformers + peft as the reference."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from workbench.models.tiny import tiny_model

PIRATE = Path(__file__).resolve().parents[2] / "data" / "loras" / "pirate"
_PRISTINE = {}


def fresh_tiny(arch: str = "llama", dtype: str = "float32"):
    """A private copy of the tiny model (seed 0): building one from scratch is slow, and
    engines change the model they run (attention, LoRA wrappers, fusion)."""
    import copy
    import dataclasses

    key = (arch, dtype)
    if key not in _PRISTINE:
        _PRISTINE[key] = tiny_model(arch, dtype=dtype)
    base = _PRISTINE[key]
    return dataclasses.replace(base, model=copy.deepcopy(base.model))


def make_adapter(path: Path, *, arch: str = "llama", rank: int = 4, seed: int = 1,
                 targets: tuple[str, ...] = ("q_proj", "v_proj"), alpha: int = 8,
                 net=None, base_model: str | None = None, **config) -> Path:
    """A random-initialised peft LoRA adapter for the tiny `arch` model (or `net`), saved."""
    from peft import LoraConfig, get_peft_model

    net = net if net is not None else fresh_tiny(arch).model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft_model = get_peft_model(net, LoraConfig(
            r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False,
            lora_dropout=0.0, **config))
        for name, param in peft_model.named_parameters():  # small deltas, like a trained one
            if "lora_B" in name:
                param.data.mul_(0.2)
    peft_model.save_pretrained(path)
    if base_model is not None:  # what resolvers match against the served model
        cfg = Path(path) / "adapter_config.json"
        data = json.loads(cfg.read_text())
        data["base_model_name_or_path"] = base_model
        cfg.write_text(json.dumps(data))
    return Path(path)


def peft_greedy(net, tokenizer, adapter: Path | None, prompts: list[list[int]],
                max_tokens: int) -> list[list[int]]:
    """transformers' greedy `generate` (with the adapter through peft), one prompt at a time."""
    if adapter is not None:
        from peft import PeftModel

        net = PeftModel.from_pretrained(net, str(adapter))
    net.eval()
    outs = []
    for ids in prompts:
        x = torch.tensor([ids], device=net.device)
        with torch.no_grad():
            y = net.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                             max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             pad_token_id=tokenizer.eos_token_id)
        outs.append(y[0, len(ids):].tolist())
    return outs
