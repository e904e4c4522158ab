"""`AsyncLLMEngine`: the engine for servers and notebooks, stepped by a background thread.

`generate(prompt, params, request_id)` is an async generator of `RequestOutput`s;
`beam_search(prompt, request_id, params)` yields one `BeamSearchOutput` when the search ends;
`encode(prompt, pooling_params, request_id)` yields one `PoolingRequestOutput`;
`abort` stops a request. It implements `EngineClient` (`protocol.py`), all the serving layer
uses of an engine. The step loop runs in its own daemon thread, never on the event loop, so it
works under uvicorn and inside a running Jupyter kernel alike; outputs travel back to the
caller's loop with `call_soon_threadsafe`. Each instance owns its loop thread: several engines
(and a synchronous `LLM` sharing the same `LLMEngine`) coexist in one process. The steps
themselves run on the process's one model thread (`model_thread.py`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from workbench.config import EngineConfig
from workbench.engine.engine import EngineStats, LLMEngine
from workbench.engine.model_thread import on_model_thread
from workbench.engine.requests.beam_search import BeamSearchOutput
from workbench.engine.requests.input_processor import PromptInput
from workbench.engine.requests.outputs import PoolingRequestOutput, RequestOutput
from workbench.errors import EngineDeadError, RequestTimeoutError, ServiceUnavailableError
from workbench.pooling_params import PoolingParams
from workbench.sampling_params import BeamSearchParams, SamplingParams

logger = logging.getLogger(__name__)


class AsyncLLMEngine:
    """Async front of an `LLMEngine` (see the module docstring)."""

    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._wake = threading.Event()
        self._stopped = False
        self._dead: BaseException | None = None
        # server limits (build_app sets them from ServerConfig): None = unbounded
        self.max_waiting_requests: int | None = None
        self.request_timeout: float | None = None
        self.on_dead: Any = None  # called (from the engine thread) if the loop dies
        self._submitted: set[str] = set()  # this front's requests not finished yet
        self._admission = threading.Lock()  # capacity check and reservation, as one step
        self._admitting = 0  # admitted, not yet in the scheduler's waiting queue
        self._thread = threading.Thread(target=self._loop, name="workbench-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig, loaded: Any = None) -> "AsyncLLMEngine":
        """Loads the engine on the model thread, where its steps will run
        (`engine/model_thread.py`)."""
        return cls(on_model_thread(LLMEngine, config, loaded))

    @classmethod
    def from_llm(cls, llm) -> "AsyncLLMEngine":
        """Serves the same engine as a synchronous `workbench.LLM`."""
        return cls(llm.llm_engine)

    # -- what the serving layer reads -------------------------------------------------------
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def served_model_name(self) -> str:
        return self.engine.served_model_name

    @property
    def model_path(self) -> str:
        return str(getattr(self.engine.loaded, "path", None) or self.engine.config.model)

    @property
    def is_pooling_model(self) -> bool:
        return self.engine.is_pooling_model

    @property
    def pooling_tasks(self) -> tuple[str, ...]:
        return self.engine.pooling_tasks

    @property
    def classifier_labels(self) -> list[str]:
        return self.engine.classifier_labels

    @property
    def generation_defaults(self) -> dict[str, Any]:
        return dict(self.engine.generation_defaults)

    @property
    def arithmetic(self) -> dict[str, Any]:
        return self.engine.arithmetic

    @property
    def hidden_size(self) -> int:
        return self.engine.model.config.hidden_size

    @property
    def model_shape(self) -> Any:
        """What captures and interventions are resolved against (`workbench.inside.resolve.
        ModelShape`; None for an encoder). Not part of `EngineClient`: a server without it
        leaves the resolution to the engine."""
        return self.engine.inputs.model_shape

    def load_sae(self, name: str, path: str) -> Any:
        """`LLMEngine.load_sae` on the model thread (between steps). Not part of
        `EngineClient`: the runtime SAE routes are this engine's."""
        return on_model_thread(self.engine.load_sae, name, path)

    def unload_sae(self, name: str) -> None:
        on_model_thread(self.engine.unload_sae, name)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def get_num_unfinished_requests(self) -> int:
        return self.engine.get_num_unfinished_requests()

    def num_held_blocks(self) -> int:
        bm = self.engine.block_manager
        held = sum(1 for block in bm.blocks if block.ref_count > 0)
        return max(held, bm.num_blocks - bm.num_free_blocks)

    @property
    def errored(self) -> bool:
        return self._dead is not None

    def check_health(self) -> None:
        if self._dead is not None:
            raise EngineDeadError(f"The engine loop stopped: {self._dead!r}")

    # -- LoRA adapters ----------------------------------------------------------------------
    def add_lora(self, lora_request: Any) -> bool:
        return self.engine.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self.engine.remove_lora(lora_int_id)

    def list_loras(self) -> set[int]:
        """Adapters loaded in memory or resident in a slot (ids a new adapter must not take)."""
        manager = self.engine.lora
        if manager is None:
            return set()
        return manager.list_loras() | {i for i in manager.resident if i is not None}

    # -- requests ---------------------------------------------------------------------------
    async def generate(self, prompt: PromptInput, sampling_params: SamplingParams,
                       request_id: str, priority: int = 0, **kwargs: Any
                       ) -> AsyncIterator[RequestOutput]:
        """Yields the request's outputs as the engine produces them; aborts if cancelled."""
        async for out in self._submit(self.engine.add_request, prompt, sampling_params,
                                      request_id, priority=priority, **kwargs):
            yield out

    async def generate_together(self, requests: list[tuple[str, PromptInput, SamplingParams,
                                                           Any]]) -> list[RequestOutput]:
        """Queues every (request id, prompt, params, lora_request) under one hold of the
        engine's lock, so no step runs between them and the scheduler admits them together
        (within `max_num_seqs`, the token budget and `max_loras`); returns their final outputs
        in order. Any refusal aborts those already queued; so does cancelling."""
        self.check_health()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

        def deliver(item: RequestOutput | BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        ids = [rid for rid, *_ in requests]

        def add_all() -> None:
            added: list[str] = []
            with self.engine.lock:
                try:
                    for rid, prompt, params, lora in requests:
                        self.engine.add_request(rid, prompt, params, lora_request=lora,
                                                on_output=deliver)
                        added.append(rid)
                except BaseException:
                    if added:  # the loop's next step hands them over as aborted
                        self.engine.abort_request(added)
                        self._wake.set()
                    raise

        deadline = None if self.request_timeout is None else loop.time() + self.request_timeout
        self._admit()
        try:
            await asyncio.to_thread(add_all)
        finally:
            with self._admission:
                self._admitting -= 1
        self._submitted.update(ids)
        self._wake.set()
        finals: dict[str, RequestOutput] = {}
        try:
            while len(finals) < len(ids):
                item = await self._next(queue, deadline, ids[0])
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    finals[item.request_id] = item
        finally:
            self._submitted.difference_update(ids)
            left = [rid for rid in ids if rid not in finals]
            if left:
                threading.Thread(target=self.engine.abort_request, args=(left,),
                                 daemon=True).start()
                self._wake.set()
        return [finals[rid] for rid in ids]

    async def beam_search(self, prompt: PromptInput, request_id: str, params: BeamSearchParams,
                          lora_request: Any = None, priority: int = 0
                          ) -> AsyncIterator[BeamSearchOutput]:
        """Runs a beam search in the engine's steps; yields its one, final `BeamSearchOutput`."""
        async for out in self._submit(self.engine.add_beam_request, prompt, params, request_id,
                                      priority=priority, lora_request=lora_request):
            yield out

    async def encode(self, prompt: PromptInput, pooling_params: PoolingParams, request_id: str,
                     priority: int = 0, cache_salt: str | None = None,
                     lora_request: Any = None) -> AsyncIterator[PoolingRequestOutput]:
        """Runs a pooling request (embed / classify / score / encode), with `lora_request`'s
        adapter if given; yields its one, final `PoolingRequestOutput` (finish_reason 'error'
        if the model failed); aborts if cancelled."""
        async for out in self._submit(self.engine.add_pooling_request, prompt, pooling_params,
                                      request_id, priority=priority, cache_salt=cache_salt,
                                      lora_request=lora_request):
            yield out

    def check_inputs(self, request_id: str, prompt: PromptInput,
                      params: SamplingParams) -> None:
        """`generate`'s input checks as a dry run: raises what it would refuse, queues nothing."""
        self.engine.inputs.process(request_id, prompt, params)

    async def _submit(self, add, prompt, params, request_id: str, **kwargs: Any):
        self.check_health()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

        def deliver(item: RequestOutput | BaseException) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        deadline = None if self.request_timeout is None else loop.time() + self.request_timeout
        self._admit()
        try:  # off the event loop: adding waits for the engine lock while a step runs
            await asyncio.to_thread(add, request_id, prompt, params, on_output=deliver, **kwargs)
        finally:
            with self._admission:
                self._admitting -= 1
        self._submitted.add(request_id)
        self._wake.set()
        finished = False
        try:
            while not finished:
                item = await self._next(queue, deadline, request_id)
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._submitted.discard(request_id)
            if not finished:
                self._abort_soon(request_id)

    def _admit(self) -> None:
        """Checks capacity and reserves a place in one step: a burst cannot overshoot the
        bound while earlier requests are still on their way into the waiting queue."""
        with self._admission:
            self.check_capacity()
            self._admitting += 1

    def check_capacity(self) -> None:
        """`max_waiting_requests`: a full waiting queue refuses new requests (503). Requests
        admitted but not yet added count as waiting."""
        limit = self.max_waiting_requests
        if limit is None:
            return
        waiting = len(self.engine.scheduler.waiting) + self._admitting
        if waiting >= limit:
            raise ServiceUnavailableError(
                "The engine is currently busy and cannot accept new requests. Please try again "
                f"later or on a different instance. ({waiting} requests are waiting; the limit "
                f"is --max-waiting-requests={limit}.)", retry_after=1)

    async def _next(self, queue: asyncio.Queue, deadline: float | None, request_id: str):
        """The next output; past `request_timeout` a `RequestTimeoutError` (then aborted)."""
        if deadline is None:
            return await queue.get()
        try:
            async with asyncio.timeout_at(deadline):
                return await queue.get()
        except TimeoutError:
            raise RequestTimeoutError(
                f"Request {request_id} did not finish within --request-timeout="
                f"{self.request_timeout:g} s and was aborted.") from None

    async def abort(self, request_id: str) -> None:
        await asyncio.to_thread(self.engine.abort_request, request_id)
        self._wake.set()

    def abort_all(self) -> None:
        """Aborts every request submitted through this front (a server's shutdown deadline);
        never blocks the caller's loop."""
        pending = list(self._submitted)
        if pending:
            threading.Thread(target=self.engine.abort_request, args=(pending,),
                             daemon=True).start()
            self._wake.set()

    def _abort_soon(self, request_id: str) -> None:
        """Aborts from a `finally` that may run during cancellation: never blocks the loop."""
        threading.Thread(target=self.engine.abort_request, args=(request_id,), daemon=True).start()
        self._wake.set()

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopped:
            if not self.engine.has_unfinished_requests() and not self.engine._finished_outside_step:
                self._wake.wait(timeout=0.05)
                self._wake.clear()
                continue
            try:
                self.engine.steps(lambda: not self._stopped)
                time.sleep(0)  # between steps the lock is free: let a waiting add or abort take it
            except BaseException as exc:  # a bug, not a model failure: nothing can be served
                logger.exception("engine loop died")
                self._dead = exc
                self._fail_all(exc)
                if self.on_dead is not None:
                    self.on_dead(exc)  # `workbench serve` exits non-zero: a supervisor restarts it
                return

    def _fail_all(self, exc: BaseException) -> None:
        dead = EngineDeadError(f"The engine loop stopped: {exc!r}")
        with self.engine.lock:
            listeners = list(self.engine._listeners.values())
            self.engine._listeners.clear()
        for deliver in listeners:
            deliver(dead)

    def shutdown(self) -> None:
        """Stops the step thread; requests submitted through this front and still running are
        aborted (their blocks freed), so an `LLM` sharing the engine goes on cleanly."""
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=5)
        leftover = list(self._submitted)
        if leftover:
            self.engine.abort_request(leftover)
            with self.engine.lock:  # nobody listens any more: whoever steps next collects them
                for rid in leftover:
                    self.engine._listeners.pop(rid, None)
