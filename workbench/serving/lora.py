"""`ServedAdapters`: which adapters a server serves by name, and the reference's rules for them.

One instance is shared by every endpoint of a server (like vLLM's `OpenAIServingModels`):
- static adapters (`--lora-modules name=path` or the JSON form), loaded at start-up;
- default adapters per message content type (`--default-mm-loras '{"text": PATH}'`): each
  is served under its content type's name, and a chat request whose model is not an adapter
  uses the adapter named like one of its content parts' types when exactly one such adapter
  matches (vLLM's rule: any served adapter whose name is a content type counts);
- runtime `load` / `unload` (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, on when
  `VLLM_ALLOW_RUNTIME_LORA_UPDATING` — or `WORKBENCH_ALLOW_RUNTIME_LORA_UPDATING` — is true),
  with the reference's messages for missing fields, duplicates, names of base models and
  unknown adapters;
- resolution: with runtime updating on, a request naming an unknown model asks each resolver
  (`resolver.py`) for it; found but unloadable -> 400 "LoRA adapter 'X' was found but could
  not be loaded.", not found -> the usual 404.
Each adapter gets a fresh `lora_int_id` when (re)loaded, so an in-place reload never reuses
the old one's prefix-cache blocks.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from http import HTTPStatus
from pathlib import Path
from typing import Any

from workbench.engine.protocol import EngineClient
from workbench.errors import ValidationError
from workbench.lora.request import LoRARequest
from workbench.lora.resolver import FilesystemResolver, LoRAResolver
from workbench.lora.security import is_within
from workbench.serving.errors import ServingError, make_error

logger = logging.getLogger("workbench.lora")

RUNTIME_ENV = ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "WORKBENCH_ALLOW_RUNTIME_LORA_UPDATING")
RESOLVER_DIR_ENV = "VLLM_LORA_RESOLVER_CACHE_DIR"
_IDS = itertools.count(1)  # adapter ids handed out by servers, process-wide


def runtime_updating_allowed(environ: Any = None) -> bool:
    environ = os.environ if environ is None else environ
    return any(str(environ.get(name, "")).strip().lower() in ("1", "true", "yes", "on")
               for name in RUNTIME_ENV)


@dataclass(frozen=True)
class LoRAModulePath:
    """One `--lora-modules` entry."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(value: Any) -> LoRAModulePath:
    """`name=path`, a JSON object `{"name", "path", "base_model_name"?}`, a dict or a
    `LoRAModulePath` -> `LoRAModulePath`; raises `ValueError` saying what is wrong."""
    if isinstance(value, LoRAModulePath):
        return value
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"Invalid JSON format for --lora-modules: {exc}") from exc
    if isinstance(value, dict):
        unknown = set(value) - {"name", "path", "base_model_name", "is_3d_lora_weight"}
        if unknown:
            raise ValueError(f"Unknown keys in a --lora-modules entry: {sorted(unknown)}")
        if value.get("is_3d_lora_weight"):
            raise ValueError("is_3d_lora_weight (3D MoE LoRA weights) is not supported")
        if not value.get("name") or not value.get("path"):
            raise ValueError("A --lora-modules JSON entry needs both 'name' and 'path'")
        return LoRAModulePath(str(value["name"]), str(value["path"]),
                              value.get("base_model_name"))
    if isinstance(value, str) and "=" in value:
        name, path = value.split("=", 1)
        if name and path:
            return LoRAModulePath(name, path)
    raise ValueError(f"Invalid --lora-modules entry {value!r}: expected NAME=PATH or a JSON "
                     'object {"name": ..., "path": ...}')


def _error(message: str, err_type: str = "InvalidUserInput",
           status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> Exception:
    return ServingError(make_error(message, err_type, status))


MAX_LORA_NAME_CHARS = 256


def valid_lora_name(name: str) -> bool:
    """A name that can be listed, logged and echoed: 1-256 printable characters (no newline,
    no control character), so a name never forges a log line nor bloats `/v1/models`."""
    return 0 < len(name) <= MAX_LORA_NAME_CHARS and name.isprintable()


def _check_name(name: str) -> None:
    if not valid_lora_name(name):
        raise _error(f"'lora_name' must be 1 to {MAX_LORA_NAME_CHARS} printable characters "
                     "(no newline or other control character).")


class ServedAdapters:
    """Adapter names of one server (see the module docstring)."""

    def __init__(self, engine: EngineClient | None, base_model_names: Iterable[str],
                 resolvers: Iterable[LoRAResolver] = (), allow_runtime: bool | None = None,
                 load_dirs: Iterable[str] = ()):
        self.engine = engine  # add_lora / remove_lora / list_loras (`EngineClient`)
        self.base_model_names = tuple(base_model_names)
        self.resolvers = list(resolvers)
        self.load_dirs = tuple(str(d) for d in load_dirs)  # where /v1/load_lora_adapter may read
        self.allow_runtime = runtime_updating_allowed() if allow_runtime is None else allow_runtime
        self.lora_requests: dict[str, LoRARequest] = {}
        self._lock = threading.RLock()

    @classmethod
    def from_config(cls, engine: EngineClient, config: Any) -> "ServedAdapters":
        """Built from a `ServerConfig`: loads its static and default adapters (errors raise)."""
        names = tuple(config.served_model_names or (engine.served_model_name,))
        base_names = {*names, str(engine.config.model or ""), str(engine.model_path or "")}
        base_names |= {Path(n).name for n in list(base_names) if n}
        dirs = list(getattr(config, "lora_resolver_dirs", ()) or ())
        if os.environ.get(RESOLVER_DIR_ENV):
            dirs.append(os.environ[RESOLVER_DIR_ENV])
        resolvers = [FilesystemResolver(d, base_names - {""}) for d in dirs]
        load_dirs = [*dirs, *(getattr(config, "lora_load_dirs", ()) or ())]
        adapters = cls(engine, names, resolvers, getattr(config, "allow_runtime_lora_updating",
                                                          None), load_dirs)
        if adapters.allow_runtime:
            logger.warning("Runtime LoRA updating is enabled: /v1/load_lora_adapter and "
                           "/v1/unload_lora_adapter are served. This should ONLY be used for "
                           "local development!")
        modules = [parse_lora_module(m) for m in getattr(config, "lora_modules", ()) or ()]
        defaults = dict(getattr(config, "default_mm_loras", None) or {})
        if (modules or defaults) and not engine.config.enable_lora:
            raise ValueError("--lora-modules and --default-mm-loras need --enable-lora")
        for module in modules:
            adapters.add(module.name, module.path, base_model_name=module.base_model_name)
        for content_type, path in defaults.items():
            adapters.add(content_type, path)
        return adapters

    @property
    def base_model_name(self) -> str:
        return self.base_model_names[0]

    def _new_request(self, name: str, path: str, base_model_name: str | None = None,
                     load_inplace: bool = False) -> LoRARequest:
        base = base_model_name if base_model_name in self.base_model_names else None
        return LoRARequest(name, self._next_id(), path, base_model_name=base,
                           load_inplace=load_inplace)

    def _next_id(self) -> int:
        """A fresh id: unique in the process (several servers may share one engine) and not
        one the engine already holds (an offline `LoRARequest` of the same `LLM`)."""
        taken = self._engine().list_loras()
        while True:
            lora_id = next(_IDS)
            if lora_id not in taken:
                return lora_id

    def _engine_add(self, lora: LoRARequest) -> None:
        self._engine().add_lora(lora)

    def _engine_remove(self, lora: LoRARequest) -> None:
        self._engine().remove_lora(lora.lora_int_id)

    def _engine(self) -> EngineClient:
        """The engine every adapter change needs (built without one: names only)."""
        if self.engine is None:
            raise RuntimeError("these ServedAdapters have no engine to load adapters into")
        return self.engine

    # -- static ------------------------------------------------------------------------------
    def add(self, name: str, path: str, base_model_name: str | None = None) -> LoRARequest:
        """A start-up adapter; a bad one raises `ValueError` naming it."""
        if not valid_lora_name(name):
            raise ValueError(f"LoRA adapter name {name[:64]!r} must be 1 to "
                             f"{MAX_LORA_NAME_CHARS} printable characters.")
        if name in self.base_model_names:
            raise ValueError(f"The lora adapter '{name}' conflicts with a served base model.")
        lora = self._new_request(name, path, base_model_name)
        try:
            self._engine_add(lora)
        except ValidationError as exc:
            raise ValueError(exc.message) from exc
        with self._lock:
            self.lora_requests[name] = lora
        return lora

    # -- runtime -----------------------------------------------------------------------------
    def load(self, lora_name: str | None, lora_path: str | None, load_inplace: bool = False,
             base_model_name: str | None = None) -> str:
        """`/v1/load_lora_adapter`; raises a `ServingError` with the reference's answer."""
        if not lora_name or not lora_path:
            raise _error("Both 'lora_name' and 'lora_path' must be provided.")
        _check_name(lora_name)
        if lora_name in self.base_model_names:
            raise _error(f"The lora adapter '{lora_name}' conflicts with a served base model.")
        if "\x00" in lora_path or not is_within(self.load_dirs, lora_path):  # no arbitrary paths
            raise _error("'lora_path' must lie inside a directory the server allows adapters "
                         "from (--lora-load-dir or --lora-resolver-dir); "
                         + ("none is configured." if not self.load_dirs else
                            "this path does not."))
        with self._lock:
            old = self.lora_requests.get(lora_name)
            if old is not None and not load_inplace:
                raise _error(f"The lora adapter '{lora_name}' has already been loaded. If you "
                             "want to load the adapter in place, set 'load_inplace' to True.")
            lora = self._new_request(lora_name, lora_path, base_model_name, load_inplace)
            try:
                self._engine_add(lora)
            except ValidationError as exc:
                # deferred: workbench.lora.adapter imports torch (the engine that raised
                # has it loaded already; serving itself stays torch-free)
                from workbench.lora.adapter import LoRANotFoundError

                if isinstance(exc, LoRANotFoundError):
                    raise _error(exc.message, "NotFoundError", HTTPStatus.NOT_FOUND) from exc
                raise _error(exc.message, "BadRequestError") from exc
            self.lora_requests[lora_name] = lora
            if old is not None:  # replaced in place: the old id (and its cached blocks) retire
                self._engine_remove(old)
        logger.info("Loaded new LoRA adapter: name '%s', path '%s'", lora_name, lora_path)
        return f"Success: LoRA adapter '{lora_name}' added successfully."

    def unload(self, lora_name: str | None, lora_int_id: int | None = None) -> str:
        """`/v1/unload_lora_adapter`; raises a `ServingError` with the reference's answer."""
        if not lora_name:
            raise _error("'lora_name' needs to be provided to unload a LoRA adapter.")
        with self._lock:
            lora = self.lora_requests.get(lora_name)
            if lora is None or (lora_int_id is not None and lora_int_id != lora.lora_int_id):
                raise _error(f"The lora adapter '{lora_name}' cannot be found.",
                             "NotFoundError", HTTPStatus.NOT_FOUND)
            del self.lora_requests[lora_name]
            self._engine_remove(lora)
        logger.info("Removed LoRA adapter: name '%s'", lora_name)
        return f"Success: LoRA adapter '{lora_name}' removed successfully."

    def resolve(self, lora_name: str) -> LoRARequest | None:
        """An unknown model name through the resolvers (runtime updating only): the adapter,
        or None when no resolver has it; found but unloadable -> 400 `ServingError`."""
        with self._lock:
            if lora_name in self.lora_requests:
                return self.lora_requests[lora_name]
            if not self.allow_runtime or not self.resolvers or not valid_lora_name(lora_name):
                return None
            found = False
            for resolver in self.resolvers:
                candidate = resolver.resolve_lora(self.base_model_name, lora_name)
                if candidate is None:
                    continue
                found = True
                lora = replace(candidate, lora_int_id=self._next_id())
                try:
                    self._engine_add(lora)
                except ValidationError as exc:
                    logger.warning("Failed to load LoRA '%s' resolved by %r: %s", lora_name,
                                   resolver, exc.message)
                    continue
                self.lora_requests[lora_name] = lora
                logger.info("Resolved and loaded LoRA adapter '%s' from %s", lora_name,
                            lora.lora_path)
                return lora
        if found:
            raise _error(f"LoRA adapter '{lora_name}' was found but could not be loaded.",
                         "BadRequestError")
        return None

    # -- what requests see -------------------------------------------------------------------
    def knows(self, model: str) -> bool:
        """Stage 1 for a name that is not a base model: a served or resolvable adapter."""
        return model in self.lora_requests or self.resolve(model) is not None

    def adapter_for(self, model: str | None, content_types: set[str] | None = None
                    ) -> LoRARequest | None:
        """vLLM's `_maybe_get_adapters`: the named adapter; else (chat) the one default adapter
        matching the request's content types, when exactly one does; else the base model."""
        with self._lock:
            if model and model in self.lora_requests:
                return self.lora_requests[model]
            if content_types:
                matches = [lora for name, lora in self.lora_requests.items()
                           if name in content_types]
                if len(matches) == 1:
                    return matches[0]
        return None

    def cards(self) -> list[tuple[str, str, str]]:
        """(id, root, parent) of every served adapter, for /v1/models."""
        with self._lock:
            return [(lora.lora_name, lora.lora_path, lora.base_model_name or self.base_model_name)
                    for lora in self.lora_requests.values()]


def message_content_types(messages: Iterable[Any]) -> set[str]:
    """The content-part types of chat messages, cut at the first '_' (`image_url` -> `image`),
    as vLLM's `get_message_types`; plain string contents have none."""
    types: set[str] = set()
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else getattr(
            message, "content", None)
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
                if isinstance(kind, str):
                    types.add(kind.split("_")[0])
    return types
