"""`LoRARequest`: which adapter a request runs with, under vLLM's names (torch-free).

>>> LoRARequest("pirate", 1, "data/loras/pirate").adapter_id
1
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, eq=False)
class LoRARequest:
    """An adapter by name, a positive integer id and a PEFT directory (as vLLM's).

    The id names the adapter inside the engine (its slot, its prefix-cache blocks): one id,
    one set of weights. Two requests are equal when their names are (vLLM's rule).
    """

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: str | None = None  # the parent shown by /v1/models (None: first served name)
    load_inplace: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int):
            raise TypeError(f"lora_int_id must be an int, got {self.lora_int_id!r}")
        if self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id}")
        object.__setattr__(self, "lora_path", str(self.lora_path))

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoRARequest) and self.lora_name == other.lora_name

    def __hash__(self) -> int:
        return hash(self.lora_name)
