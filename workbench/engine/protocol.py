"""`EngineClient`: everything the serving layer asks of an engine (vLLM's `vllm/engine/protocol.py`).

The OpenAI servings (`workbench.serving`), the adapter registry (`workbench.serving.lora`),
the soak driver and the `Workbench` facade talk to an engine only through this protocol, so
they never reach into the `LLMEngine` behind it. `AsyncLLMEngine` implements it; a test's
fake engine implements the members its tests use. It is `runtime_checkable`: `isinstance`
checks that every member exists (not their signatures). Importing it loads no torch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from workbench.config import EngineConfig
    from workbench.engine.engine import EngineStats
    from workbench.engine.requests.beam_search import BeamSearchOutput
    from workbench.engine.requests.input_processor import PromptInput
    from workbench.engine.requests.outputs import PoolingRequestOutput, RequestOutput
    from workbench.pooling_params import PoolingParams
    from workbench.sampling_params import BeamSearchParams, SamplingParams


@runtime_checkable
class EngineClient(Protocol):
    """An engine as a server sees it: its model's facts and limits, requests, adapters, health."""

    # -- the model and its limits -----------------------------------------------------------
    @property
    def tokenizer(self) -> Any: ...

    @property
    def config(self) -> EngineConfig: ...

    @property
    def served_model_name(self) -> str: ...

    @property
    def model_path(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def hidden_size(self) -> int:
        """Width of the model's embeddings (what `prompt_embeds` rows must have)."""

    @property
    def generation_defaults(self) -> dict[str, Any]:
        """Sampling defaults from the model's `generation_config.json`."""

    @property
    def arithmetic(self) -> dict[str, Any]:
        """What the model computes in: dtype, a GGUF model's `gguf_activations`,
        `batch_invariant` (`LLMEngine.arithmetic`)."""

    # -- pooling ----------------------------------------------------------------------------
    @property
    def is_pooling_model(self) -> bool: ...

    @property
    def pooling_tasks(self) -> tuple[str, ...]:
        """The pooling tasks the model serves, its default first."""

    @property
    def classifier_labels(self) -> list[str]:
        """The label words a generative model classifies with (none for an embedding model)."""

    # -- requests ---------------------------------------------------------------------------
    def generate(self, prompt: PromptInput, sampling_params: SamplingParams, request_id: str,
                 priority: int = 0, **kwargs: Any) -> AsyncIterator[RequestOutput]:
        """The request's outputs as the engine produces them (`lora_request=` picks an adapter)."""

    async def generate_together(self, requests: list[tuple[str, PromptInput, SamplingParams,
                                                           Any]]) -> list[RequestOutput]:
        """Several (request id, prompt, params, lora_request) queued before any step can run,
        so the scheduler admits them into the same step within its budgets; their final
        outputs, in order (cross-request comparisons: `serving/compare.py`)."""

    def beam_search(self, prompt: PromptInput, request_id: str, params: BeamSearchParams,
                    lora_request: Any = None, priority: int = 0
                    ) -> AsyncIterator[BeamSearchOutput]:
        """One beam search; yields its one, final `BeamSearchOutput`."""

    def encode(self, prompt: PromptInput, pooling_params: PoolingParams, request_id: str,
               priority: int = 0, cache_salt: str | None = None, lora_request: Any = None
               ) -> AsyncIterator[PoolingRequestOutput]:
        """One pooling request; yields its one, final `PoolingRequestOutput`."""

    async def abort(self, request_id: str) -> None:
        """Stops a request; its stream ends."""

    def abort_all(self) -> None:
        """Aborts every request submitted through this client (a server's shutdown deadline);
        never blocks the caller's loop."""

    def check_inputs(self, request_id: str, prompt: PromptInput, params: SamplingParams) -> None:
        """Dry run of `generate`'s input checks (lengths, ids, grammar): raises what `generate`
        would refuse, queues nothing."""

    # -- LoRA adapters ----------------------------------------------------------------------
    def add_lora(self, lora_request: Any) -> bool:
        """Loads an adapter ahead of its requests; raises if it is bad."""

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forgets an adapter; False if it was not loaded."""

    def list_loras(self) -> set[int]:
        """Ids of the adapters the engine holds (loaded, or resident in a slot)."""

    # -- health and load --------------------------------------------------------------------
    max_waiting_requests: int | None  # a full waiting queue refuses new requests (503)

    @property
    def errored(self) -> bool:
        """True once the engine loop died: nothing can be served any more."""

    def check_health(self) -> None:
        """Raises `EngineDeadError` when `errored`."""

    def stats(self) -> EngineStats:
        """Running / waiting requests, KV-cache use, token counters (for /load, /metrics)."""

    def get_num_unfinished_requests(self) -> int:
        """Requests the engine still holds (finished ones are dropped when collected)."""

    def num_held_blocks(self) -> int:
        """KV-cache blocks a request still holds (prefix-cached blocks nobody holds are free)."""

    def shutdown(self) -> None:
        """Stops the engine's work; requests still running are aborted."""
