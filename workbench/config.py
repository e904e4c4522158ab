"""Frozen configuration of an engine: which model, how large a batch, how much KV cache.

`EngineConfig` is built once from keyword arguments (`LLM(**kwargs)`, `workbench serve` flags)
and never changes; invalid values raise `ValidationError` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.errors import ValidationError

_DTYPES = ("auto", "float32", "bfloat16", "float16", "gguf")
_GGUF_ACTIVATIONS = ("float32", "q8")


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to know before it loads a model.

    >>> EngineConfig(model="smollm2-135m-instruct").block_size
    16
    """

    model: str = "smollm2-135m-instruct"
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16 | gguf (the file's blocks)
    # with dtype gguf: the activations the blocks meet, "float32" (exact to the dequantized
    # model) or "q8" (llama.cpp's CPU arithmetic: int8 per block, engine/kernels/gguf_q8.py)
    gguf_activations: str = "float32"
    kernel: str = "auto"  # auto | avx2 | amx | avx512bf16 | onednn | torch (engine/kernels/projections.py)
    # a request's tokens and logprobs the same bits whatever shares its batch, however its
    # prompt is chunked, with or without prefix-cache hits (engine/step/runner.py, at a cost)
    batch_invariant: bool = False
    device: str = "auto"  # auto | cpu | cuda
    seed: int = 0
    max_model_len: int | None = None  # None: the model's own limit
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: derived from kv_cache_memory_gb
    # None: KV_CACHE_UTILIZATION of the memory available after the weights, at most what
    # max_num_seqs sequences of max_model_len take (engine/step/model_limits.py)
    kv_cache_memory_gb: float | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"  # fcfs | priority
    max_logprobs: int = 20  # -1: no limit
    served_model_name: str | None = None
    enable_lora: bool = False  # LoRA adapters per request (workbench.lora)
    max_loras: int = 1  # distinct adapters in one step (resident slots), as vLLM's
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # adapters kept loaded in memory; None: max_loras
    classifier_labels: tuple[str, ...] = ("no", "yes")  # label words of a generative classifier
    # a request's capture and logit lens at most (MiB of float32); steering vectors by name
    # (name -> a .pt, .npy, .safetensors or .json file of one [hidden] vector)
    max_capture_mb: float = 256.0
    steering_vectors: tuple[tuple[str, str], ...] = ()
    # sparse autoencoders by name (name -> a folder in SAELens's format: workbench.features.sae)
    saes: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValidationError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}.",
                                  parameter="dtype", value=self.dtype)
        if self.gguf_activations not in _GGUF_ACTIVATIONS:
            raise ValidationError(f"gguf_activations must be one of {_GGUF_ACTIVATIONS}, got "
                                  f"{self.gguf_activations!r}.", parameter="gguf_activations",
                                  value=self.gguf_activations)
        if self.gguf_activations != "float32" and self.dtype != "gguf":
            raise ValidationError(f"gguf_activations={self.gguf_activations!r} "
                                  "(--gguf-activations) quantizes the activations that a GGUF "
                                  "model's blocks meet: it needs dtype='gguf' (--dtype gguf), "
                                  f"got dtype={self.dtype!r}.", parameter="gguf_activations",
                                  value=self.gguf_activations)
        if self.gguf_activations == "q8" and self.enable_lora:
            raise ValidationError("gguf_activations='q8' (llama.cpp's int8 arithmetic) does not "
                                  "cover LoRA adapters (their products would run on float32 "
                                  "activations beside it): leave one of them off.",
                                  parameter="gguf_activations", value="q8")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValidationError(f"device must be auto, cpu or cuda, got {self.device!r}.",
                                  parameter="device", value=self.device)
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValidationError(f"{name} must be at least 1, got {getattr(self, name)}.",
                                      parameter=name, value=getattr(self, name))
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValidationError(f"max_model_len must be at least 2, got {self.max_model_len}.",
                                  parameter="max_model_len", value=self.max_model_len)
        if self.kv_cache_memory_gb is not None and not self.kv_cache_memory_gb > 0:
            raise ValidationError(f"kv_cache_memory_gb must be positive, got "
                                  f"{self.kv_cache_memory_gb}.", parameter="kv_cache_memory_gb",
                                  value=self.kv_cache_memory_gb)
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValidationError(f"num_kv_blocks must be at least 1, got {self.num_kv_blocks}.",
                                  parameter="num_kv_blocks", value=self.num_kv_blocks)
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValidationError(
                f"scheduling_policy must be fcfs or priority, got {self.scheduling_policy!r}.",
                parameter="scheduling_policy", value=self.scheduling_policy)
        labels = (self.classifier_labels,) if isinstance(self.classifier_labels, str) else tuple(
            self.classifier_labels)
        object.__setattr__(self, "classifier_labels", labels)
        if len(labels) < 2 or not all(isinstance(x, str) and x for x in labels):
            raise ValidationError(
                f"classifier_labels must be at least two non-empty words, got {list(labels)}.",
                parameter="classifier_labels", value=list(labels))
        if not isinstance(self.batch_invariant, bool):
            raise ValidationError(f"batch_invariant must be a boolean, got "
                                  f"{self.batch_invariant!r}.", parameter="batch_invariant",
                                  value=self.batch_invariant)
        if self.batch_invariant and self.enable_lora:
            raise ValidationError("batch_invariant=True does not cover LoRA adapters (their "
                                  "products run batched by adapter): leave one of them off.",
                                  parameter="batch_invariant", value=True)
        if not self.max_capture_mb > 0:
            raise ValidationError(f"max_capture_mb must be positive, got {self.max_capture_mb}.",
                                  parameter="max_capture_mb", value=self.max_capture_mb)
        for name in ("steering_vectors", "saes"):
            given = getattr(self, name)
            object.__setattr__(self, name, tuple(
                (given.items() if isinstance(given, dict) else given)))
        if self.max_logprobs < -1:
            raise ValidationError(f"max_logprobs must be -1 or at least 0, got {self.max_logprobs}.",
                                  parameter="max_logprobs", value=self.max_logprobs)
        for name in ("max_loras", "max_lora_rank"):
            if getattr(self, name) < 1:
                raise ValidationError(f"{name} must be at least 1, got {getattr(self, name)}.",
                                      parameter=name, value=getattr(self, name))
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValidationError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})",
                parameter="max_cpu_loras", value=self.max_cpu_loras)
