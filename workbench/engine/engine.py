"""The synchronous engine: `add_request`, `step`, `abort_request`, `has_unfinished_requests`.

Generation (`add_request`), beam searches (`add_beam_request`) and pooling requests
(`add_pooling_request`) run in the same steps; each request's kind handler
(`engine/handlers/`), named by its `kind` when it is added, computes its sequences' results
from the step's rows and builds its outputs. One `step()` is: schedule -> run the model on the
scheduled tokens -> commit them (the bookkeeper: blocks, prompt logprobs, forks of `n > 1`)
-> each kind computes its results (sample / beam step / pool) -> the bookkeeper applies them
all (`update_from_output`) -> the outputs of this step. A model failure ends the step's
requests with 'error' (logged once with their ids; the cause is each output's `error`). The
engine is not thread-safe by itself; `lock` serializes callers (the async engine's thread, a
notebook calling `LLM.generate`), and every step runs on the process's one model thread
(`model_thread.py`), whoever calls it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workbench.config import EngineConfig
from workbench.engine.bookkeeper import Bookkeeper
from workbench.engine.handlers import (
    BeamHandler,
    GenerationHandler,
    KindHandler,
    PoolingHandler,
)
from workbench.engine.kernels import c_layer_ops
from workbench.engine.kernels.projections import reads_bf16_weights
from workbench.engine.model_thread import jobs_waiting, on_model_thread
from workbench.engine.requests.beam_search import BeamSearchOutput
from workbench.engine.requests.block_manager import BlockManager
from workbench.engine.requests.input_processor import InputProcessor, PromptInput
from workbench.engine.requests.output_processor import OutputProcessor
from workbench.engine.requests.outputs import PoolingRequestOutput, RequestOutput
from workbench.engine.requests.request import Request, RequestKind, Sequence, unique_requests
from workbench.engine.requests.scheduler import Scheduler, SchedulerOutput
from workbench.engine.requests.step_results import StepResults
from workbench.engine.step import model_limits
from workbench.engine.step.encoder_runner import EncoderRunner
from workbench.engine.step.lora_manager import LoRAManager
from workbench.engine.step.pooling import label_token_ids
from workbench.engine.step.runner import ModelRunner, kv_shape
from workbench.engine.step.sampler import Sampler
from workbench.errors import ValidationError, refuse
from workbench.features.sae import SparseAutoencoder
from workbench.inside.resolve import ModelShape
from workbench.inside.vectors import load_vector
from workbench.lora.request import LoRARequest
from workbench.models import memory
from workbench.models.loader import compute_dtype, load_model
from workbench.pooling_params import PoolingParams
from workbench.sampling_params import BeamSearchParams, SamplingParams

logger = logging.getLogger(__name__)


class EngineLock:
    """The engine's lock (re-entrant: one step, or one change between steps), which counts
    the threads waiting for it, so that a run of steps (`LLMEngine.steps`) hands it over."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._count = threading.Lock()  # guards `waiting`
        self.waiting = 0

    def __enter__(self) -> "EngineLock":
        if not self._lock.acquire(blocking=False):
            with self._count:
                self.waiting += 1
            try:
                self._lock.acquire()
            finally:
                with self._count:
                    self.waiting -= 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prompt_tokens_total: int
    generation_tokens_total: int
    prefix_cache_hit_rate: float
    num_preemptions: int
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of which found there
    num_steps: int = 0  # steps run (each one batch of whatever requests it scheduled)


class LLMEngine:
    """Continuous-batching engine over one causal LM (see the module docstring)."""

    lora: LoRAManager | None = None  # with `enable_lora`

    def __init__(self, config: EngineConfig, loaded: Any = None):
        self.config = config
        if loaded is None:
            loaded = load_model(config.model, dtype=config.dtype, device=config.device,
                                bf16_weights=reads_bf16_weights(config.kernel))
        self.loaded = loaded
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        hf = self.model.config
        self.is_pooling_model = getattr(loaded, "kind", "generate") == "embed"  # cannot generate
        self.vocab_size = hf.vocab_size
        self.max_model_len = model_limits.max_model_len(loaded, config, self.is_pooling_model)
        if (not config.enable_chunked_prefill and not self.is_pooling_model
                and config.max_num_batched_tokens < self.max_model_len):
            # a sequence longer than one step's budget could never be scheduled: it would wait forever
            raise ValidationError(
                f"max_num_batched_tokens ({config.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({self.max_model_len}) with chunked prefill disabled. Please "
                "increase max_num_batched_tokens, decrease max_model_len or enable chunked prefill.",
                parameter="max_num_batched_tokens", value=config.max_num_batched_tokens)
        self.served_model_name = config.served_model_name or loaded.served_name
        gen = getattr(self.model, "generation_config", None)
        self.generation_defaults = model_limits.generation_defaults(gen)
        eos = self.tokenizer.eos_token_id
        if self.is_pooling_model:  # an encoder: no KV cache, whole prompts (engine/step/encoder_runner.py)
            self._init_encoder()
        else:
            self._init_decoder(hf)
        self.inputs = InputProcessor(self.tokenizer, self.vocab_size, self.max_model_len,
                                     config.max_logprobs, eos,
                                     model_limits.extra_eos_ids(gen, eos),
                                     hidden_size=hf.hidden_size,
                                     model_shape=self._model_shape(hf))
        self.outputs = OutputProcessor(self.tokenizer, eos, self.max_model_len, self.vocab_size,
                                       entropy=c_layer_ops.entropy)
        self.books = Bookkeeper(self.scheduler, self.block_manager, self.outputs)
        self._init_handlers(hf)
        self.requests: dict[str, Request] = {}
        self._finished_outside_step: list[Request] = []
        self._listeners: dict[str, Callable[[Any], None]] = {}
        self.lock = EngineLock()
        self.prompt_tokens_total = 0

    @property
    def generation_tokens_total(self) -> int:
        return self.books.generation_tokens_total

    # -- set-up -----------------------------------------------------------------------------
    def _init_decoder(self, hf) -> None:
        """KV cache blocks, scheduler and model runner; LoRA slots with `enable_lora`."""
        config = self.config
        dtype = compute_dtype(self.model)
        num_blocks = model_limits.num_kv_blocks(hf, dtype, config, self.max_model_len,
                                                memory.available_beside(self.model))
        self.block_manager = BlockManager(num_blocks, config.block_size,
                                          config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs,
                                   config.max_num_batched_tokens, config.enable_chunked_prefill,
                                   config.scheduling_policy)
        self.runner: ModelRunner | EncoderRunner = ModelRunner(
            self.model, num_blocks, config.block_size, config.kernel, config.batch_invariant,
            getattr(self.loaded, "quantized", None), config.gguf_activations)
        self.scheduler.window = self.runner.window  # blocks out of every layer's window go
        if config.enable_lora:  # adapters per request: LoRA layers with resident slots
            self.lora = LoRAManager(self.model, config.max_loras, config.max_lora_rank,
                                    config.max_cpu_loras)
            self.runner.lora = self.lora
            self.scheduler.max_loras = config.max_loras

    def _model_shape(self, hf) -> ModelShape | None:
        """What captures and interventions are checked against (None: an encoder)."""
        runner = self.runner
        if not isinstance(runner, ModelRunner):
            return None
        heads, config = hf.num_attention_heads, self.config
        vectors = {name: load_vector(path, hf.hidden_size, f"steering_vectors[{name}]")
                   for name, path in config.steering_vectors}
        shape = ModelShape(len(runner.layers), hf.hidden_size, heads, kv_shape(hf)[1],
                           self.vocab_size, dict(runner.missing_sites),
                           int(config.max_capture_mb * 2**20), vectors)
        for name, path in config.saes:
            self.load_sae(name, path, shape)
        return shape

    def load_sae(self, name: str, path: str, shape: ModelShape | None = None) -> Any:
        """Loads the SAE in the folder `path` as `name` (`workbench.features.sae`), checked
        against this model (its hook and width); refused, naming it, where it does not fit or
        the name is taken. Returns it."""
        shape = shape or self.inputs.model_shape
        if shape is None:
            refuse("saes: an embedding or encoder model has no hooks to read an SAE at.", "saes",
                   name)
        if name in shape.saes:
            refuse(f"saes: an SAE named {name!r} is already loaded.", "saes", name)
        sae = SparseAutoencoder.load(name, path)
        sae.check_model(shape.num_layers, shape.hidden_size, shape.missing_sites)
        shape.saes[name] = sae  # the shape's own dict: requests resolved later see it
        return sae

    def unload_sae(self, name: str) -> None:
        """Forgets the SAE `name`; requests already resolved against it keep their copy."""
        shape = self.inputs.model_shape
        if shape is None or name not in shape.saes:
            refuse(f"saes: no SAE {name!r} is loaded.", "saes", name)
        del shape.saes[name]

    def _init_handlers(self, hf) -> None:
        """One handler per kind of request, each given only what it uses; a request's `kind`
        names its handler."""
        config, vocab, inputs, outputs = self.config, self.vocab_size, self.inputs, self.outputs
        label_ids = (None if self.is_pooling_model
                     else label_token_ids(self.tokenizer, config.classifier_labels))
        normalize = getattr(self.loaded, "normalize", True) if self.is_pooling_model else True
        self.generation_handler = GenerationHandler(inputs, outputs, Sampler(config.seed, vocab),
                                                    vocab, config.max_num_seqs)
        self.beam_handler = BeamHandler(inputs, outputs, self.tokenizer, vocab,
                                        config.max_num_seqs)
        self.pooling_handler = PoolingHandler(inputs, self.pooling_tasks, self.served_model_name,
                                              hf.hidden_size, normalize, label_ids)
        self.handlers: dict[RequestKind, KindHandler] = {
            h.kind: h for h in (self.generation_handler, self.beam_handler, self.pooling_handler)}

    def _init_encoder(self) -> None:
        """Block manager as bookkeeping only (no KV tensors, no prefix cache), no chunking, and
        a step budget that takes any whole prompt."""
        config = self.config
        if config.batch_invariant:
            raise ValidationError(f"batch_invariant=True is for decoder models: {config.model} "
                                  "is an encoder, whose batches are padded to their longest "
                                  "prompt.", parameter="batch_invariant", value=True)
        budget = max(config.max_num_batched_tokens, self.max_model_len)
        num_blocks = -(-budget // config.block_size) + config.max_num_seqs  # a step's worth
        self.block_manager = BlockManager(num_blocks, config.block_size, False)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, budget, False,
                                   config.scheduling_policy)
        self.runner = EncoderRunner(self.model, self.loaded.pooling or "mean")
        if config.enable_lora:  # refused by name rather than ignored
            raise ValidationError("LoRA adapters are not supported for pooling models.",
                                  parameter="enable_lora", value=True)

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: PromptInput, params: SamplingParams,
                    priority: int = 0, arrival_time: float | None = None,
                    cache_salt: str | None = None, lora_request: Any = None,
                    on_output: Callable[[RequestOutput], None] | None = None) -> Request:
        """Validates and queues a request; raises `ValidationError` for what can't be served.

        `on_output`, when given, receives each of the request's outputs from whichever thread
        steps the engine (those outputs are then not returned by `step`).
        """
        self._refuse_generation()
        self._check_lora(lora_request)
        kwargs = self._request_kwargs(priority, arrival_time, cache_salt, lora_request)
        req = self.generation_handler.make_request(request_id, prompt, params, **kwargs)
        self._enqueue(req, self.generation_handler, on_output)
        return req

    def add_beam_request(self, request_id: str, prompt: PromptInput, params: BeamSearchParams,
                         lora_request: Any = None, priority: int = 0,
                         on_output: Callable[[BeamSearchOutput], None] | None = None) -> Request:
        """Queues a beam search; its one output (finished) is a `BeamSearchOutput`."""
        self._refuse_generation()
        self._check_lora(lora_request)
        req = self.beam_handler.make_request(request_id, prompt, params, lora_request, priority)
        self._enqueue(req, self.beam_handler, on_output)
        return req

    def add_pooling_request(self, request_id: str, prompt: PromptInput, params: PoolingParams,
                            priority: int = 0, arrival_time: float | None = None,
                            on_output: Callable[[PoolingRequestOutput], None] | None = None,
                            cache_salt: str | None = None, lora_request: Any = None) -> Request:
        """Queues a pooling request (embed / classify / score / encode, `engine/step/pooling.py`);
        its one output (finished) is a `PoolingRequestOutput`. Prompts may use the whole
        context (up to max_model_len tokens). `lora_request`: an adapter of a generative model
        it runs with, as `add_request`'s."""
        self._check_lora(lora_request)
        kwargs = self._request_kwargs(priority, arrival_time, cache_salt, lora_request)
        req = self.pooling_handler.make_request(request_id, prompt, params, **kwargs)
        self._enqueue(req, self.pooling_handler, on_output)
        return req

    @staticmethod
    def _request_kwargs(priority: int, arrival_time: float | None, cache_salt: str | None,
                        lora_request: LoRARequest | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"priority": priority, "cache_salt": cache_salt,
                                  "lora_request": lora_request}
        if arrival_time is not None:
            kwargs["arrival_time"] = arrival_time
        return kwargs

    @property
    def pooling_tasks(self) -> tuple[str, ...]:
        """The pooling tasks this model serves, its default first."""
        if self.is_pooling_model:
            return ("embed", "score", "encode")
        return ("classify", "score", "embed", "encode")

    @property
    def arithmetic(self) -> dict[str, Any]:
        """What the model computes in: `dtype` ("gguf": the file's blocks), for blocks their
        `gguf_activations` ("float32", or "q8": llama.cpp's int8 arithmetic), and whether the
        engine is `batch_invariant`; the LLM's card and `/v1/models` show it."""
        gguf = bool(getattr(self.loaded, "quantized", None))
        dtype = "gguf" if gguf else str(getattr(self.loaded, "dtype", self.config.dtype))
        found: dict[str, Any] = {"dtype": dtype.removeprefix("torch.")}
        if gguf:
            found["gguf_activations"] = self.config.gguf_activations
        found["batch_invariant"] = self.config.batch_invariant
        return found

    @property
    def classifier_labels(self) -> list[str]:
        """The label words a generative model classifies with (none for an embedding model)."""
        return [] if self.is_pooling_model else list(self.config.classifier_labels)

    def _refuse_generation(self) -> None:
        if self.is_pooling_model:
            raise ValidationError(
                f"Model '{self.served_model_name}' is an embedding model: it cannot generate "
                f"text. It serves the pooling tasks {self.pooling_tasks}.",
                parameter="model", value=self.served_model_name)

    def _enqueue(self, req: Request, handler: KindHandler, on_output: Callable | None) -> None:
        """Queues a checked request; `handler` (its kind) drives it from now on."""
        request_id = req.request_id
        with self.lock:
            if request_id in self.requests:
                raise ValidationError(f"Request id {request_id} is already running.",
                                      parameter="request_id", value=request_id)
            req.kind = handler.kind
            seq = Sequence(req, 0, req.prompt_token_ids, len(req.prompt_token_ids))
            req.sequences.append(seq)
            self.books.start_sequence(seq)
            self.requests[request_id] = req
            if on_output is not None:
                self._listeners[request_id] = on_output
            self.scheduler.add(seq)
            self.prompt_tokens_total += len(req.prompt_token_ids)

    # -- LoRA adapters ----------------------------------------------------------------------
    def _check_lora(self, lora_request: Any) -> None:
        """Loads (or touches) a request's adapter; refuses it when LoRA is off or it is bad."""
        if lora_request is None:
            return
        if self.lora is None:
            raise ValidationError(f"Got lora_request {lora_request} but LoRA is not enabled!",
                                  parameter="lora_request", value=lora_request)
        if not isinstance(lora_request, LoRARequest):
            raise ValidationError(f"lora_request must be a LoRARequest, got "
                                  f"{type(lora_request).__name__}.", parameter="lora_request")
        self.lora.add(lora_request)

    def add_lora(self, lora_request: Any) -> bool:
        """Loads an adapter ahead of its requests (vLLM's `add_lora`); raises if it is bad."""
        self._check_lora(lora_request)
        return True

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forgets an adapter; requests still using it read it again from its path."""
        if self.lora is None:
            return False
        with self.lock:  # never in the middle of a step
            return self.lora.remove(lora_int_id)

    def list_loras(self) -> set[int]:
        return set() if self.lora is None else self.lora.list_loras()

    # -- ending requests --------------------------------------------------------------------
    def abort_request(self, request_id: str | list[str]) -> None:
        """Stops requests now and frees their blocks; they end with finish_reason 'abort'."""
        ids = [request_id] if isinstance(request_id, str) else request_id
        with self.lock:
            for rid in ids:
                req = self.requests.get(rid)
                if req is not None:
                    self.books.finish_all(req, "abort")
                    self._finished_outside_step.append(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # -- the step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """schedule -> run -> commit -> each kind computes -> apply -> this step's outputs; on
        the model thread, whichever thread calls (`engine/model_thread.py`)."""
        return on_model_thread(self._step)

    def steps(self, more: Callable[[], bool]) -> None:
        """Steps on the model thread while there is work and `more()` (asked after each step)
        says so, with no hand-over between steps (each costs ~0.1-0.2 ms of thread wake-ups:
        ~5% of a small model's lone stream); it returns as soon as another thread waits for
        the engine's lock (an add, an abort) or for the model thread, so they wait no longer
        than one step. Outputs go to the requests' listeners (every request has one)."""
        on_model_thread(self._steps, more)

    def _steps(self, more: Callable[[], bool]) -> None:
        while True:
            self._step()
            if (not more() or self.lock.waiting or jobs_waiting()
                    or not (self.requests or self._finished_outside_step)):
                return
            time.sleep(0)  # the GIL to whoever waits for it: a server's event loop reads and
            # adds requests between steps (else a small model's steps, mostly Python, keep it)

    def _step(self) -> list[RequestOutput]:
        with self.lock:
            touched, self._finished_outside_step = self._finished_outside_step, []
            out = self.scheduler.schedule()
            if out.scheduled:
                touched += self._run(out)
            return self._collect(touched)

    def _run(self, out: SchedulerOutput) -> list[Request]:
        """Runs the scheduled step; returns the requests it gave something to report."""
        requests = unique_requests(s.seq.request for s in out.scheduled)
        books = self.books
        try:
            books.count_steps(out)
            rows = self.runner.execute(out)
            batches = books.commit(out, rows)
            failed = [req for req in requests if req.errored]
            results = StepResults()
            for kind, batch in batches.items():
                self.handlers[kind].compute([(s, r) for s, r in batch if not s.request.errored],
                                            rows, results)
            books.update_from_output(results)
            advanced = [seq.request for batch in batches.values() for seq, _ in batch]
            ended = [s.seq.request for s in out.scheduled if s.seq.seq_id in rows.stopped]
            return unique_requests(advanced + ended + failed)
        except Exception as exc:  # noqa: BLE001 - the model (or no one request): these end
            books.fail_step(requests, exc)  # and the requests of later steps go on
            return requests

    def _collect(self, touched: list[Request]) -> list[RequestOutput]:
        """The touched requests' outputs; finished requests leave, listeners get theirs."""
        results = []
        for req in unique_requests(touched):
            handler = self.handlers[req.kind]
            try:
                out = handler.output(req)
            except Exception as exc:  # noqa: BLE001 - building its output failed: it ends here
                self.books.fail(req, exc)
                out = handler.error_output(req)
            listener = self._listeners.get(req.request_id)
            if req.finished:
                self.requests.pop(req.request_id, None)
                self._listeners.pop(req.request_id, None)
            if out is None:
                continue
            if listener is None:
                results.append(out)
            else:
                self._deliver(req, listener, out)
        return results

    def _deliver(self, req: Request, listener: Callable[[Any], None], out: Any) -> None:
        try:
            listener(out)
        except Exception:  # noqa: BLE001 - its consumer is gone (a closed event loop)
            logger.warning("request %s: its listener failed; aborting it", req.request_id)
            if not req.finished:
                self._listeners[req.request_id] = lambda _out: None  # nobody listens now
                self.books.finish_all(req, "abort")
                self._finished_outside_step.append(req)

    # -- introspection ----------------------------------------------------------------------
    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=bm.usage,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            prefix_cache_hit_rate=bm.prefix_hits / bm.prefix_queries if bm.prefix_queries else 0.0,
            num_preemptions=self.scheduler.num_preemptions,
            prefix_cache_queries=bm.prefix_queries * bm.block_size,
            prefix_cache_hits=bm.prefix_hits * bm.block_size,
            num_steps=self.books.steps_total,
        )

    def reset_prefix_cache(self) -> None:
        with self.lock:
            self.block_manager.reset_prefix_cache()
