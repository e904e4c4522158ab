"""Runtime resolution of adapters by name: `LoRAResolver` and the local-directory resolver.

When a request names a model the server does not know and runtime LoRA updating is on, each
resolver is asked in turn for an adapter of that name (vLLM's `LoRAResolver`). The built-in
`FilesystemResolver(directory)` answers with `directory/<name>` when it holds a PEFT LoRA
adapter made for the served base model (`peft_type == "LORA"`, `base_model_name_or_path` one of
the base model's names), as vLLM's filesystem resolver. Names are single path components and
the resolved directory must stay inside `directory` (no `..`, no absolute names, no symlinks
out): a request can never make the server read an arbitrary path.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path

from workbench.errors import ValidationError
from workbench.lora.request import LoRARequest
from workbench.lora.security import safe_join


class LoRAResolver(ABC):
    """Finds an adapter for a name; None when it has none."""

    @abstractmethod
    def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        """An adapter for `lora_name` over `base_model_name` (its `lora_int_id` is replaced by
        the server's own), or None."""


def safe_child(directory: str | os.PathLike, name: str) -> Path | None:
    """`directory/name` if `name` is one plain path component and the result, symlinks
    resolved, stays inside `directory`; else None."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or os.path.isabs(name):
        return None
    root = Path(directory).expanduser()
    try:
        candidate = safe_join(root, name, parameter="model")
    except ValidationError:
        return None
    return candidate if candidate != root.resolve() else None


class FilesystemResolver(LoRAResolver):
    """Adapters in subdirectories of one local directory (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike, base_model_names: Iterable[str] = ()):
        self.directory = Path(directory).expanduser()
        self.base_model_names = {str(n) for n in base_model_names if n}

    def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
        path = safe_child(self.directory, lora_name)
        if path is None or not (path / "adapter_config.json").is_file():
            return None
        try:
            config = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return LoRARequest(lora_name, 1, str(path))  # found; loading will say what is wrong
        if not isinstance(config, dict) or str(config.get("peft_type", "")).upper() != "LORA":
            return None
        names = self.base_model_names | {base_model_name}
        base = config.get("base_model_name_or_path")
        if base not in names and Path(str(base)).name not in names:
            return None
        return LoRARequest(lora_name, 1, str(path))

    def __repr__(self) -> str:
        return f"FilesystemResolver({str(self.directory)!r})"
