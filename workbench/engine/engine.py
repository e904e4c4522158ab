"""The synchronous engine: `add_request`, `step`, `abort_request`, `has_unfinished_requests`.

Beam searches (`add_beam_request`) run in the same steps: their beams are sequences of one
request; each step every live beam's logits give its top 2 x width candidates, and the next beams
are forks of their parents (sharing KV blocks, copy-on-write) with the chosen token appended.

One `step()` is: schedule -> run the model on the scheduled tokens -> record prompt logprobs ->
fork the siblings of `n > 1` requests whose prompt just finished -> sample -> append tokens,
detokenize, check stops -> free finished sequences -> return the outputs of this step.
The engine is not thread-safe by itself; `lock` serializes callers (the async engine's thread,
a notebook calling `LLM.generate`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import torch

from workbench.config import EngineConfig
from workbench.engine.beam_search import BeamSearch, BeamSearchOutput, top_candidates
from workbench.engine.block_manager import BlockManager
from workbench.engine.input_processor import InputProcessor, PromptInput
from workbench.engine import model_limits
from workbench.engine.encoder_runner import EncoderRunner
from workbench.engine.output_processor import OutputProcessor
from workbench.engine.pooling import finish as pool_finish, label_token_ids, pooling_request
from workbench.engine.outputs import (CompletionOutput, PoolingOutput, PoolingRequestOutput,
                                      RequestOutput)
from workbench.engine.request import Request, Sequence, SequenceStatus, unique_requests
from workbench.engine.runner import ModelRunner
from workbench.engine.sampler import Sampler, SamplingRow
from workbench.engine.scheduler import Scheduler
from workbench.engine.structured import attach_grammar_masks
from workbench.engine.thinking import ThinkingBudget
from workbench.errors import ValidationError
from workbench.pooling_params import PoolingParams
from workbench.sampling_params import BeamSearchParams, SamplingParams

logger = logging.getLogger(__name__)

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


def _seed_for(seed: int, index: int) -> int:
    """Distinct, reproducible generator seeds for the n samples of one seeded request."""
    return (seed * 0x9E3779B97F4A7C15 + index) % (2**63)


class LLMEngine:
    """Continuous-batching engine over one causal LM (see the module docstring)."""

    lora = None  # a `workbench.lora.LoRAManager` with `enable_lora`

    def __init__(self, config: EngineConfig, loaded: Any = None):
        from workbench.models import load_model

        self.config = config
        if loaded is None:
            loaded = load_model(config.model, dtype=config.dtype, device=config.device)
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
        extra = model_limits.extra_eos_ids(gen, eos)
        dtype = next(self.model.parameters()).dtype
        if self.is_pooling_model:  # an encoder: no KV cache, whole prompts (engine/encoder_runner.py)
            self._init_encoder()
            if config.enable_lora:  # refused by name rather than ignored
                raise ValidationError("LoRA adapters are not supported for pooling models.",
                                      parameter="enable_lora", value=True)
        else:
            num_blocks = model_limits.num_kv_blocks(hf, dtype, config, self.max_model_len)
            self.block_manager = BlockManager(num_blocks, config.block_size,
                                              config.enable_prefix_caching)
            self.scheduler = Scheduler(self.block_manager, config.max_num_seqs,
                                       config.max_num_batched_tokens, config.enable_chunked_prefill,
                                       config.scheduling_policy)
            self.runner = ModelRunner(self.model, num_blocks, config.block_size, config.kernel)
            if config.enable_lora:  # adapters per request: LoRA layers with resident slots
                from workbench.lora.manager import LoRAManager

                self.lora = LoRAManager(self.model, config.max_loras, config.max_lora_rank,
                                        config.max_cpu_loras)
                self.runner.lora = self.lora
                self.scheduler.max_loras = config.max_loras
        self._label_ids = (None if self.is_pooling_model
                           else label_token_ids(self.tokenizer, config.classifier_labels))
        self.sampler = Sampler(config.seed, self.vocab_size)
        self.inputs = InputProcessor(self.tokenizer, self.vocab_size, self.max_model_len,
                                     config.max_logprobs, eos, extra, hidden_size=hf.hidden_size)
        self.outputs = OutputProcessor(self.tokenizer, eos, self.max_model_len, self.vocab_size)
        self.requests: dict[str, Request] = {}
        self._finished_outside_step: list[Request] = []
        self._listeners: dict[str, Callable[[RequestOutput], None]] = {}
        self.lock = threading.RLock()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    # -- set-up -----------------------------------------------------------------------------
    def _init_encoder(self) -> None:
        """Block manager as bookkeeping only (no KV tensors, no prefix cache), no chunking, and
        a step budget that takes any whole prompt."""
        config = self.config
        budget = max(config.max_num_batched_tokens, self.max_model_len)
        num_blocks = -(-budget // config.block_size) + config.max_num_seqs  # a step's worth
        self.block_manager = BlockManager(num_blocks, config.block_size, False)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, budget, False,
                                   config.scheduling_policy)
        self.runner = EncoderRunner(self.model, self.loaded.pooling or "mean")

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
        if params.n > self.config.max_num_seqs:  # its samples could never all run: stuck forever
            raise ValidationError(
                f"n={params.n} is greater than max_num_seqs={self.config.max_num_seqs}.",
                parameter="n", value=params.n)
        kwargs = {"priority": priority, "cache_salt": cache_salt, "lora_request": lora_request}
        if arrival_time is not None:
            kwargs["arrival_time"] = arrival_time
        req = self.inputs.process(request_id, prompt, params, **kwargs)
        self._enqueue(req, on_output)
        return req

    def add_beam_request(self, request_id: str, prompt: PromptInput, params: BeamSearchParams,
                         lora_request: Any = None, priority: int = 0,
                         on_output: Callable[[BeamSearchOutput], None] | None = None) -> Request:
        """Queues a beam search; its one output (finished) is a `BeamSearchOutput`."""
        self._refuse_generation()
        self._check_lora(lora_request)
        if params.beam_width > self.config.max_num_seqs:
            raise ValidationError(
                f"beam_width={params.beam_width} is greater than max_num_seqs="
                f"{self.config.max_num_seqs}.", parameter="n", value=params.beam_width)
        sp = SamplingParams(max_tokens=params.max_tokens, temperature=params.temperature,
                            ignore_eos=params.ignore_eos, detokenize=False,
                            skip_special_tokens=params.skip_special_tokens)
        if isinstance(prompt, dict) and prompt.get("prompt_embeds") is not None:
            raise ValidationError("Beam search is not supported with prompt embeds.",
                                  parameter="prompt_embeds")
        req = self.inputs.process(request_id, prompt, sp, priority=priority,
                                  lora_request=lora_request)
        req.beam = BeamSearch(req.prompt_token_ids, params, self.outputs.eos_token_id,
                              self.outputs.texts, lora_request, req.prompt)
        self._enqueue(req, on_output)
        return req

    # -- LoRA adapters ----------------------------------------------------------------------
    def _check_lora(self, lora_request: Any) -> None:
        """Loads (or touches) a request's adapter; refuses it when LoRA is off or it is bad."""
        if lora_request is None:
            return
        if self.lora is None:
            raise ValidationError(f"Got lora_request {lora_request} but LoRA is not enabled!",
                                  parameter="lora_request", value=lora_request)
        from workbench.lora.request import LoRARequest

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

    def add_pooling_request(self, request_id: str, prompt: PromptInput, params: PoolingParams,
                            priority: int = 0, arrival_time: float | None = None,
                            on_output: Callable[[PoolingRequestOutput], None] | None = None,
                            cache_salt: str | None = None, lora_request: Any = None) -> Request:
        """Queues a pooling request (embed / classify / score / encode, `engine/pooling.py`);
        its one output (finished) is a `PoolingRequestOutput`. Prompts may use the whole
        context (up to max_model_len tokens). `lora_request`: an adapter of a generative model
        it runs with, as `add_request`'s."""
        self._check_lora(lora_request)
        params = params.verify(self.pooling_tasks, self.served_model_name,
                               self.model.config.hidden_size,
                               default_normalize=getattr(self.loaded, "normalize", True)
                               if self.is_pooling_model else True)
        kwargs = {"priority": priority, "cache_salt": cache_salt, "lora_request": lora_request}
        if arrival_time is not None:
            kwargs["arrival_time"] = arrival_time
        req = pooling_request(self.inputs, request_id, prompt, params, **kwargs)
        self._enqueue(req, on_output)
        return req

    @property
    def pooling_tasks(self) -> tuple[str, ...]:
        """The pooling tasks this model serves, its default first."""
        if self.is_pooling_model:
            return ("embed", "score", "encode")
        return ("classify", "score", "embed", "encode")

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

    def _enqueue(self, req: Request, on_output: Callable | None) -> None:
        request_id = req.request_id
        with self.lock:
            if request_id in self.requests:
                raise ValidationError(f"Request id {request_id} is already running.",
                                      parameter="request_id", value=request_id)
            seq = Sequence(req, 0, req.prompt_token_ids, len(req.prompt_token_ids))
            req.sequences.append(seq)
            self._start(seq)
            self.requests[request_id] = req
            if on_output is not None:
                self._listeners[request_id] = on_output
            self.scheduler.add(seq)
            self.prompt_tokens_total += len(req.prompt_token_ids)

    def _start(self, seq: Sequence) -> None:
        self.outputs.start(seq)
        compiled = seq.request.compiled_grammar
        if compiled is not None:  # each sample its own matcher
            seq.grammar_matcher = compiled.start()
        params = seq.request.params
        budget = params.thinking_token_budget
        if budget is not None and budget >= 0:
            seq.thinking = ThinkingBudget(budget, params.reasoning_end_token_ids,
                                          params.reasoning_start_token_ids)
        seed = params.seed
        if seed is not None:
            seq.generator = torch.Generator().manual_seed(_seed_for(seed, seq.index))
        else:
            seq.generator = None

    def abort_request(self, request_id: str | list[str]) -> None:
        """Stops requests now and frees their blocks; they end with finish_reason 'abort'."""
        ids = [request_id] if isinstance(request_id, str) else request_id
        with self.lock:
            for rid in ids:
                req = self.requests.get(rid)
                if req is not None:
                    self._finish_all(req, "abort")
                    self._finished_outside_step.append(req)

    def _finish_all(self, req: Request, reason: str) -> None:
        if not req.forked:  # samples 1..n-1 don't exist yet: they end too, so all n report it
            req.forked = True
            for index in range(1, req.params.n):
                child = Sequence(req, index, req.prompt_token_ids, len(req.prompt_token_ids))
                self._start(child)
                req.sequences.append(child)
        for seq in req.sequences:
            if not seq.is_finished:
                seq.finish_reason = reason
                self.scheduler.finish(seq)

    def _fail(self, req: Request, exc: BaseException) -> None:
        """Part of a step failed for this request only: it ends with 'error'; others go on."""
        if req.errored:
            return
        logger.error("request %s failed in the engine step", req.request_id, exc_info=exc)
        req.errored = True
        try:
            self._finish_all(req, "error")
        except Exception:  # noqa: BLE001 - e.g. the detokenizer of the unborn samples failed
            req.forked = True
            for seq in req.sequences:
                if not seq.is_finished:
                    seq.finish_reason = "error"
                    self.scheduler.finish(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # -- the step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        with self.lock:
            touched = self._finished_outside_step
            self._finished_outside_step = []
            out = self.scheduler.schedule()
            if out.scheduled:
                try:
                    touched += self._run(out)
                except Exception as exc:  # noqa: BLE001 - not attributable: this step's requests
                    failed = unique_requests(s.seq.request for s in out.scheduled)
                    for req in failed:
                        self._fail(req, exc)
                    touched += failed
            return self._collect(touched)

    def _run(self, out) -> list[Request]:
        now = time.time()
        counted: set[str] = set()
        for s in out.scheduled:  # per request: a step of prompt, or a step of generation
            req = s.seq.request
            if req.request_id in counted:
                continue
            counted.add(req.request_id)
            m = req.metrics
            m.first_scheduled_time = m.first_scheduled_time or now
            if s.seq.num_computed_tokens < s.seq.num_prompt_tokens:
                m.num_prefill_steps += 1
            else:
                m.num_decode_steps += 1
        try:
            rows = self.runner.execute(out)
        except Exception:  # the model failed: these requests end with 'error', others go on
            failed = unique_requests(s.seq.request for s in out.scheduled)
            for req in failed:
                req.errored = True
                self._finish_all(req, "error")
            return failed
        to_sample: list[tuple[Sequence, int]] = []
        beams: list[tuple[Sequence, int]] = []
        pooled: list[tuple[Sequence, int]] = []
        for s in out.scheduled:
            seq, req = s.seq, s.seq.request
            if req.errored:  # a sibling failed earlier in this step: its blocks are gone
                continue
            seq.num_computed_tokens += s.num_tokens
            self.block_manager.commit(seq)
            try:
                if req.pooling is not None:  # computing its prompt is its whole job
                    if seq.seq_id in rows.last_row:
                        pooled.append((seq, rows.last_row[seq.seq_id]))
                    continue
                if seq.seq_id in rows.prompt_rows:
                    first_row, count, first_pos = rows.prompt_rows[seq.seq_id]
                    self.outputs.record_prompt_logprobs(
                        req, first_pos, rows.logits[first_row:first_row + count])
                if seq.seq_id in rows.last_row and req.beam is not None:
                    beams.append((seq, rows.last_row[seq.seq_id]))
                elif seq.seq_id in rows.last_row:
                    row = rows.last_row[seq.seq_id]
                    to_sample.append((seq, row))
                    if req.params.n > 1 and not req.forked:
                        to_sample += [(child, row) for child in self._fork(seq)]
            except Exception as exc:  # noqa: BLE001 - contained to this request
                self._fail(req, exc)
        failed = [r for r in unique_requests(s.seq.request for s in out.scheduled) if r.errored]
        self._sample([(s, r) for s, r in to_sample if not s.request.errored], rows.logits)
        self._advance_beams([(s, r) for s, r in beams if not s.request.errored], rows.logits)
        self._pool(pooled, rows)
        return unique_requests(s.request for s, _ in to_sample + beams + pooled) + failed

    def _pool(self, pooled: list[tuple[Sequence, int]], rows) -> None:
        """Pooling requests whose prompt is computed get their result and finish (blocks freed)."""
        now = time.time()
        for seq, row in pooled:
            req = seq.request
            try:
                logits = rows.logits[row] if rows.logits.shape[-1] else None  # none: an encoder
                req.pooled = pool_finish(req.pooling, rows.hidden[row], logits, self._label_ids)
            except Exception as exc:  # noqa: BLE001 - contained to this request
                self._fail(req, exc)
                continue
            req.metrics.first_token_time = req.metrics.last_token_time = now
            seq.finish_reason = "stop"
            self.scheduler.finish(seq)

    def _advance_beams(self, beams: list[tuple[Sequence, int]], logits: torch.Tensor) -> None:
        """Records each beam's candidates; a search whose beams all have theirs takes a step."""
        if not beams:
            return
        searches = unique_requests(s.request for s, _ in beams)
        try:
            k = max(s.request.beam.num_candidates for s, _ in beams)
            ids, lps = top_candidates(logits[[r for _, r in beams]], k, self.vocab_size)
        except Exception as exc:  # noqa: BLE001 - the batch can't be attributed: its searches
            for req in searches:
                self._fail(req, exc)
            return
        for i, (seq, _) in enumerate(beams):
            n = seq.request.beam.num_candidates
            seq.beam_candidates = (ids[i][:n], lps[i][:n])
        for req in searches:
            try:
                if all(s.beam_candidates is not None for s in req.sequences):
                    self._beam_step(req)
            except Exception as exc:  # noqa: BLE001 - contained to this search
                self._fail(req, exc)

    def _beam_step(self, req: Request) -> None:
        """The next beams: forks of their parents plus one token; parents left behind are freed."""
        search, old = req.beam, req.sequences
        parents = search.advance([s.beam_candidates[0] for s in old],
                                 [s.beam_candidates[1] for s in old])
        req.forked = True  # the search holds its slots from now on
        beams: list[Sequence | None] = [None] * len(parents)
        for b, parent in enumerate(old):
            parent.beam_candidates = None
            kids = [i for i, p in enumerate(parents) if p == b]
            if not kids:
                self.scheduler.finish(parent)
                continue
            for i in kids[1:]:  # forked before the parent gets its own next token
                child = parent.fork(i)
                self.block_manager.fork(parent, child)
                if parent.status is SequenceStatus.WAITING:  # preempted: recomputed, like it
                    self.scheduler.add(child)
                else:
                    self.scheduler.add_running(child)
                beams[i] = child
            beams[kids[0]] = parent
        for index, (seq, beam) in enumerate(zip(beams, search.live)):
            seq.index = index
            seq.token_ids.append(beam.tokens[-1])
        req.sequences = beams
        self.generation_tokens_total += len(beams)
        if search.done:
            for seq in beams:
                self.scheduler.finish(seq)

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """The n - 1 siblings of a sequence whose prompt was just computed."""
        req = parent.request
        req.forked = True
        children = []
        for index in range(1, req.params.n):
            child = parent.fork(index)
            self.block_manager.fork(parent, child)
            self._start(child)
            req.sequences.append(child)
            self.scheduler.add_running(child)
            children.append(child)
        return children

    def _sample(self, to_sample: list[tuple[Sequence, int]], logits: torch.Tensor) -> None:
        if not to_sample:
            return
        picked = [r for _, r in to_sample]
        if picked != list(range(len(logits))):  # most steps: every row, in order: no copy
            logits = logits[picked]
        seqs = [s for s, _ in to_sample]
        try:
            sampled = list(zip(seqs, self._sample_rows(seqs, logits)))
        except Exception:  # noqa: BLE001 - one request's row may be at fault: each row alone
            sampled = []
            for i, seq in enumerate(seqs):
                if seq.request.errored:
                    continue
                try:
                    sampled += zip([seq], self._sample_rows([seq], logits[i:i + 1]))
                except Exception as exc:  # noqa: BLE001 - contained to this request
                    self._fail(seq.request, exc)
        now = time.time()
        for seq, values in sampled:
            if seq.request.errored:  # a sibling of this sample failed
                continue
            m = seq.request.metrics
            m.first_token_time = m.first_token_time or now
            m.last_token_time = now
            try:
                self.outputs.append_token(seq, *values)
            except Exception as exc:  # noqa: BLE001 - e.g. detokenization: this request only
                self._fail(seq.request, exc)
                continue
            self.generation_tokens_total += 1
            if seq.finish_reason is not None:
                self.scheduler.finish(seq)

    def _sample_rows(self, seqs: list[Sequence], logits: torch.Tensor) -> list[tuple]:
        """One token per row: (token, logprob, rank, top ids, top logprobs, tracked ids'
        logprobs) for each."""
        rows = [SamplingRow(s.request.params,  # embedded prompts have no ids to penalize
                            [] if s.request.prompt_embeds is not None else s.request.prompt_token_ids,
                            s.output_token_ids,
                            s.generator, s.request.min_tokens_stop_ids,
                            forced_token=None if s.thinking is None
                            else s.thinking.forced_token(s.output_token_ids)) for s in seqs]
        attach_grammar_masks(seqs, rows, logits, self.vocab_size)
        result = self.sampler(logits, rows)
        n = len(seqs)

        def column(t: torch.Tensor | None) -> list:
            return t.tolist() if t is not None else [None] * n

        return list(zip(result.tokens.tolist(), column(result.token_logprobs),
                        column(result.ranks), column(result.top_ids), column(result.top_logprobs),
                        result.tracked or [None] * n))

    def _collect(self, touched: list[Request]) -> list[RequestOutput]:
        results = []
        for req in unique_requests(touched):
            try:
                out = (self._pooling_output(req) if req.pooling is not None
                       else self._beam_output(req) if req.beam is not None
                       else self.outputs.make_output(req))
            except Exception as exc:  # noqa: BLE001 - building its output failed: it ends here
                self._fail(req, exc)
                out = self._error_output(req)
            listener = self._listeners.get(req.request_id)
            if req.finished:
                self.requests.pop(req.request_id, None)
                self._listeners.pop(req.request_id, None)
            if out is None:
                continue
            if listener is None:
                results.append(out)
                continue
            try:
                listener(out)
            except Exception:  # noqa: BLE001 - its consumer is gone (a closed event loop)
                logger.warning("request %s: its listener failed; aborting it", req.request_id)
                if not req.finished:
                    self._listeners[req.request_id] = lambda _out: None  # nobody listens now
                    self._finish_all(req, "abort")
                    self._finished_outside_step.append(req)
        return results

    def _error_output(self, req: Request) -> RequestOutput | BeamSearchOutput:
        """The smallest output of a failed request, built without the detokenizer."""
        if req.pooling is not None:
            return self._pooling_output(req)
        if req.beam is not None:
            return req.beam.error(req.request_id)
        outputs = [CompletionOutput(index=s.index, text="", token_ids=list(s.output_token_ids),
                                    cumulative_logprob=None, logprobs=None, finish_reason="error")
                   for s in req.sequences]
        return RequestOutput(request_id=req.request_id, prompt=req.prompt,
                             prompt_token_ids=req.prompt_token_ids, prompt_logprobs=None,
                             outputs=outputs, finished=True)

    def _pooling_output(self, req: Request) -> PoolingRequestOutput | None:
        """A pooling request reports once, when it ends: its result, or empty data with
        finish_reason 'abort' or 'error'."""
        if not req.finished:
            return None
        reason = req.sequences[0].finish_reason or "abort"
        data = req.pooled if reason == "stop" and req.pooled is not None else torch.empty(0)
        return PoolingRequestOutput(req.request_id, PoolingOutput(data), req.prompt_token_ids,
                                    req.num_cached_tokens, True, reason, req.prompt)

    def _beam_output(self, req: Request) -> BeamSearchOutput | None:
        """A beam search reports once, when it ends: its result, or a single error output."""
        if not req.finished:
            return None
        if req.errored:
            return req.beam.error(req.request_id)
        aborted = any(s.finish_reason == "abort" for s in req.sequences)
        skip = req.beam.params.skip_special_tokens
        return req.beam.result(lambda ids: self.tokenizer.decode(ids, skip_special_tokens=skip),
                               req.request_id, "abort" if aborted else "length")

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
        )

    def reset_prefix_cache(self) -> None:
        with self.lock:
            self.block_manager.reset_prefix_cache()
