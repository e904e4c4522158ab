"""`LoRAManager`: the engine's adapters — loaded ones in memory, `max_loras` resident slots.

- `attach(model, state)` wraps every adaptable projection of every decoder layer (q/k/v/o and
  gate/up/down, fused or not, `fusion.py`) in a `workbench.lora.layers.LoRALinear` and returns
  the table `module name -> (wrapper, part)` that adapters are loaded through.

- `add(request)` loads and checks an adapter (`adapter.load_adapter`) into the memory cache
  (at most `max_cpu_loras`, least recently used dropped first; a dropped adapter is read from
  its path again when next needed). Errors are `LoRALoadError`s, raised to the caller.
- Each step, `begin_step(scheduled)` makes every adapter the step uses resident in one of the
  `max_loras` slots of the layer wrappers (`workbench/lora/layers.py`), evicting the least recently used slot
  the step does not need, and tells the wrappers which token rows use which slot;
  `end_step()` clears that. The scheduler never schedules more distinct adapters in one step
  than there are slots (`Scheduler.max_loras`), as vLLM's.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workbench.engine.step.fusion import FastLinear, FusedPart
from workbench.errors import ValidationError
from workbench.lora.adapter import LoRAAdapter, load_adapter
from workbench.lora.layers import TARGETS, LoRABatch, LoRALinear, LoRAState
from workbench.lora.request import LoRARequest
from workbench.models.architectures import architecture_of, module_at
from workbench.models.loader import compute_dtype


@dataclass
class LoRAStats:
    loads: int = 0  # adapters read from disk
    slot_loads: int = 0  # adapters made resident in a slot
    slot_evictions: int = 0  # resident adapters replaced by another
    cpu_evictions: int = 0  # loaded adapters dropped from memory


class LoRAManager:
    """See the module docstring."""

    def __init__(self, model: Any, max_loras: int = 1, max_lora_rank: int = 16,
                 max_cpu_loras: int | None = None):
        self.dtype, self.device = compute_dtype(model), next(model.parameters()).device
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras or max_loras
        self.state = LoRAState(max_loras)
        arch = architecture_of(model.config)
        self.modules: dict[str, tuple[LoRALinear, int]] = attach(
            model, self.state, module_at(model, arch.layers), arch.layers)
        if not self.modules:  # adapters would load and change nothing: refused instead
            raise ValidationError(
                f"LoRA adapters need the projections {', '.join(n for _, ns in TARGETS for n in ns)}"
                f"; model_type {model.config.model_type!r} names its projections otherwise.",
                parameter="enable_lora", value=True)
        self.shapes = {name: (w.in_features, w.sizes[part])
                       for name, (w, part) in self.modules.items()}
        self._loaded: OrderedDict[int, LoRAAdapter] = OrderedDict()  # id -> adapter, LRU first
        self._resident: list[LoRAAdapter | None] = [None] * max_loras  # per slot
        self._slot_use: OrderedDict[int, None] = OrderedDict((i, None) for i in range(max_loras))
        self._lock = threading.Lock()
        self.stats = LoRAStats()

    # -- the memory cache -------------------------------------------------------------------
    def add(self, request: LoRARequest) -> LoRAAdapter:
        """Loads (or touches) `request`'s adapter; raises `LoRALoadError` / `ValidationError`."""
        with self._lock:
            known = self._loaded.get(request.lora_int_id)
            if known is not None:
                self._check_same(known.request, request)
                self._loaded.move_to_end(request.lora_int_id)
                return known
            resident = next((a for a in self._resident
                             if a is not None and a.request.lora_int_id == request.lora_int_id),
                            None)
            if resident is not None:  # dropped from memory but still in a slot
                self._check_same(resident.request, request)
        adapter = resident or load_adapter(request, self.shapes, self.max_lora_rank, self.dtype,
                                           self.device)
        with self._lock:
            self.stats.loads += resident is None
            self._loaded[request.lora_int_id] = adapter
            self._loaded.move_to_end(request.lora_int_id)
            while len(self._loaded) > self.max_cpu_loras:
                self._loaded.popitem(last=False)
                self.stats.cpu_evictions += 1
        return adapter

    @staticmethod
    def _check_same(known: LoRARequest, request: LoRARequest) -> None:
        if (known.lora_name, known.lora_path) != (request.lora_name, request.lora_path):
            raise ValidationError(
                f"lora_int_id {request.lora_int_id} is already used by the adapter "
                f"'{known.lora_name}' ({known.lora_path}); give '{request.lora_name}' another "
                "id or remove the first one.", parameter="lora_request",
                value=request.lora_int_id)

    def remove(self, lora_int_id: int) -> bool:
        """Forgets an adapter (memory and slot); True if it was known."""
        with self._lock:
            found = self._loaded.pop(lora_int_id, None) is not None
            for slot, held in enumerate(self._slots):
                if held == lora_int_id:
                    self._fill(slot, None)
                    found = True
            return found

    def list_loras(self) -> set[int]:
        with self._lock:
            return set(self._loaded)

    @property
    def _slots(self) -> list[int | None]:
        return [None if a is None else a.request.lora_int_id for a in self._resident]

    @property
    def resident(self) -> list[int | None]:
        """The adapter id in each slot (None: empty)."""
        return self._slots

    # -- the step ---------------------------------------------------------------------------
    def begin_step(self, scheduled: list[Any]) -> None:
        """`scheduled`: the runner's ordered `ScheduledSequence`s (their rows, in order)."""
        spans: dict[int, list[tuple[int, int]]] = {}
        start = 0
        for s in scheduled:
            lora = s.seq.request.lora_request
            if lora is not None:
                spans.setdefault(lora.lora_int_id, []).append((start, start + s.num_tokens))
            start += s.num_tokens
        requests = {s.seq.request.lora_request.lora_int_id: s.seq.request.lora_request
                    for s in scheduled if s.seq.request.lora_request is not None}
        slots = self._activate(requests)
        groups: list[tuple[int, torch.Tensor | None]] = []
        for lora_id, ranges in spans.items():
            if ranges == [(0, start)]:
                groups.append((slots[lora_id], None))
            else:
                rows = torch.cat([torch.arange(a, b) for a, b in ranges]).to(self.device)
                groups.append((slots[lora_id], rows))
        self.state.batch = LoRABatch(num_tokens=start, groups=groups)

    def end_step(self) -> None:
        self.state.batch = None

    def _activate(self, requests: dict[int, LoRARequest]) -> dict[int, int]:
        """Makes each adapter resident; returns adapter id -> slot."""
        if len(requests) > self.max_loras:  # the scheduler prevents this
            raise RuntimeError(f"{len(requests)} adapters in one step but max_loras="
                               f"{self.max_loras}")
        where: dict[int, int] = {}
        missing = []
        with self._lock:
            held = self._slots
            for lora_id in requests:
                if lora_id in held:
                    where[lora_id] = held.index(lora_id)
                else:
                    missing.append(lora_id)
        for lora_id in missing:
            adapter = self.add(requests[lora_id])  # from memory, or read again
            with self._lock:
                held = self._slots
                empty = [i for i in self._slot_use if held[i] is None]
                slot = empty[0] if empty else next(
                    i for i in self._slot_use if held[i] not in requests)  # least recently used
                if held[slot] is not None:
                    self.stats.slot_evictions += 1
                self._fill(slot, adapter)
                self.stats.slot_loads += 1
                where[lora_id] = slot
        with self._lock:
            for slot in where.values():
                self._slot_use.move_to_end(slot)
        return where

    def _fill(self, slot: int, adapter: LoRAAdapter | None) -> None:
        """Points every wrapper's `slot` at `adapter`'s weights (None: empties the slot)."""
        self._resident[slot] = adapter
        for wrapper, part in self.modules.values():
            wrapper.set_slot(slot, part, None)
        if adapter is not None:
            for name, (a, b) in adapter.weights.items():
                wrapper, part = self.modules[name]
                wrapper.set_slot(slot, part, (a, b, adapter.scaling))


def attach(model: Any, state: LoRAState, layers: Any = None,
           path: str = "model.layers") -> dict[str, tuple[LoRALinear, int]]:
    """Wraps the adaptable projections (`TARGETS`) of `model`'s decoder `layers` (at attribute
    `path`; default a Llama-family model's `model.model.layers`; idempotent: wrappers found
    are reset to `state`); returns `module name -> (wrapper, part index)` using PEFT's module
    names."""
    table: dict[str, tuple[LoRALinear, int]] = {}
    for i, layer in enumerate(model.model.layers if layers is None else layers):
        for owner_name, names in TARGETS:
            owner = getattr(layer, owner_name, None)
            if owner is None:
                continue
            for name in names:
                module = getattr(owner, name, None)
                full = f"{path}.{i}.{owner_name}.{name}"
                if isinstance(module, FusedPart):
                    group = module.group
                    if isinstance(group.linear, LoRALinear):
                        fused: LoRALinear = group.linear
                        if fused.state is not state:
                            fused.reset(state)
                    else:
                        fused = LoRALinear(group.linear, module.in_features, group.sizes, state)
                        # FusedGroup.linear is annotated FastLinear (fusion.py); the wrapper
                        # stands in for it: same input, same output (plus the adapters' deltas)
                        group.linear = fused  # type: ignore[assignment]
                    table[full] = (fused, module.index)
                elif isinstance(module, LoRALinear):
                    module.reset(state)
                    table[full] = (module, 0)
                elif isinstance(module, (nn.Linear, FastLinear)):
                    wrapper = LoRALinear(module, module.in_features, [module.out_features], state)
                    setattr(owner, name, wrapper)
                    table[full] = (wrapper, 0)
    return table
