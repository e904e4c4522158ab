"""The one owner of a step's bookkeeping: every change a step makes to its requests.

A step has two of them, around the kind handlers' computation (`engine/handlers/`):
- `commit`: after the model ran, the scheduled tokens are computed (blocks committed, prompt
  logprobs recorded), and a request with `n > 1` whose prompt just finished gets its `n - 1`
  siblings, which share the prompt's blocks and sample from its row;
- `update_from_output` (vLLM's name): the handlers' `StepResults` applied — tokens appended
  (detokenized, stop checks), beams re-forked, pooled results stored, finished sequences
  freed, failed requests ended with 'error', the generated-token counter.
Failures stay with their request: `fail` logs it with its id and cause, records the cause on
the request (its output's `error`) and ends all its samples; the other requests go on.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from workbench.engine.requests.request import Request, RequestKind, Sequence, SequenceStatus
from workbench.engine.requests.thinking import ThinkingBudget

if TYPE_CHECKING:  # annotations only
    from workbench.engine.requests.block_manager import BlockManager
    from workbench.engine.requests.output_processor import OutputProcessor
    from workbench.engine.requests.scheduler import Scheduler, SchedulerOutput
    from workbench.engine.requests.step_results import NextBeams, StepResults
    from workbench.engine.step.runner import LogitRows

logger = logging.getLogger("workbench.engine")

Batches = dict[RequestKind, list[tuple[Sequence, int]]]  # per kind: (sequence, logits row)


def describe(exc: BaseException) -> str:
    """An exception as a request's `error`: "RuntimeError: what went wrong"."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _seed_for(seed: int, index: int) -> int:
    """Distinct, reproducible generator seeds for the n samples of one seeded request."""
    return (seed * 0x9E3779B97F4A7C15 + index) % (2**63)


class Bookkeeper:
    """Applies what a step did to its requests (see the module docstring)."""

    def __init__(self, scheduler: Scheduler, block_manager: BlockManager,
                 outputs: OutputProcessor):
        self.scheduler = scheduler
        self.block_manager = block_manager
        self.outputs = outputs
        self.generation_tokens_total = 0
        self.steps_total = 0  # steps that ran requests

    # -- sequences --------------------------------------------------------------------------
    def start_sequence(self, seq: Sequence) -> None:
        """A new sequence's detokenizer, grammar matcher, thinking budget and generator."""
        self.outputs.start(seq)
        compiled = seq.request.compiled_grammar
        if compiled is not None:  # each sample its own matcher
            seq.grammar_matcher = compiled.start()
        params = seq.request.params
        budget = params.thinking_token_budget
        if budget is not None and budget >= 0:
            end_ids = params.reasoning_end_token_ids
            assert end_ids is not None  # SamplingParams refuses a budget without them
            seq.thinking = ThinkingBudget(budget, end_ids, params.reasoning_start_token_ids)
        seed = params.seed
        if seed is not None:
            seq.generator = torch.Generator().manual_seed(_seed_for(seed, seq.index))
        else:
            seq.generator = None

    def finish_all(self, req: Request, reason: str) -> None:
        """Ends every sample of a request with `reason`, the unborn ones (n > 1) too."""
        if not req.forked:  # samples 1..n-1 don't exist yet: they end too, so all n report it
            req.forked = True
            for index in range(1, req.params.n):
                child = Sequence(req, index, req.prompt_token_ids, len(req.prompt_token_ids))
                self.start_sequence(child)
                req.sequences.append(child)
        for seq in req.sequences:
            if not seq.is_finished:
                seq.finish_reason = reason
                self.scheduler.finish(seq)

    # -- failures ---------------------------------------------------------------------------
    def fail(self, req: Request, exc: BaseException, *, logged: bool = False) -> None:
        """This request's part of a step failed: it ends with 'error' and `exc` as its cause;
        the other requests go on. `logged`: the caller already logged `exc`."""
        if req.errored:
            return
        if not logged:
            logger.error("request %s failed in the engine step: %s", req.request_id,
                         describe(exc), exc_info=exc)
        req.error = describe(exc)
        try:
            self.finish_all(req, "error")
        except Exception:  # noqa: BLE001 - e.g. the detokenizer of the unborn samples failed
            req.forked = True
            for seq in req.sequences:
                if not seq.is_finished:
                    seq.finish_reason = "error"
                    self.scheduler.finish(seq)

    def fail_step(self, requests: list[Request], exc: BaseException) -> None:
        """A failure no single request owns (the model's forward): every request of the step
        ends with it; one log line (and traceback) names them all."""
        live = [req for req in requests if not req.errored]
        if not live:
            return
        logger.error("the engine step failed for requests %s: %s",
                     ", ".join(req.request_id for req in live), describe(exc), exc_info=exc)
        for req in live:
            self.fail(req, exc, logged=True)

    # -- before the handlers: the scheduled work is done ------------------------------------
    def count_steps(self, out: SchedulerOutput) -> None:
        """The engine's step count (`EngineStats.num_steps`); per request: its first scheduled
        time, a step of prompt or of generation, and whether other requests shared the step
        (and how many requests it ran)."""
        now = time.time()
        self.steps_total += 1
        first: dict[str, Sequence] = {}
        for s in out.scheduled:
            first.setdefault(s.seq.request.request_id, s.seq)
        for seq in first.values():
            m = seq.request.metrics
            m.first_scheduled_time = m.first_scheduled_time or now
            m.num_shared_steps += len(first) > 1
            m.max_step_requests = max(m.max_step_requests, len(first))
            if seq.num_computed_tokens < seq.num_prompt_tokens:
                m.num_prefill_steps += 1
            else:
                m.num_decode_steps += 1

    def commit(self, out: SchedulerOutput, rows: LogitRows) -> Batches:
        """Commits the computed tokens and forks finished prompts' siblings; per kind, the
        (sequence, row) pairs that completed a token (forked siblings share their parent's).
        A request whose forward stopped early (`rows.stopped`) ends here, with its prompt."""
        batches: Batches = {"generate": [], "beam": [], "pool": []}
        for s in out.scheduled:
            seq, req = s.seq, s.seq.request
            if req.errored:  # a sibling failed earlier in this step: its blocks are gone
                continue
            seq.num_computed_tokens += s.num_tokens
            self.block_manager.commit(seq)
            try:
                if seq.seq_id in rows.prompt_rows:
                    first_row, count, first_pos = rows.prompt_rows[seq.seq_id]
                    self.outputs.record_prompt_logprobs(
                        req, first_pos, rows.logits[first_row:first_row + count])
            except Exception as exc:  # noqa: BLE001 - contained to this request
                self.fail(req, exc)
                continue
            if seq.seq_id in rows.last_row:
                batches[req.kind].append((seq, rows.last_row[seq.seq_id]))
            elif seq.seq_id in rows.stopped:  # its forward stopped early: it ends, no token
                seq.finish_reason = "stop_at_layer"
                self.scheduler.finish(seq)
        return {kind: self._with_siblings(batch) for kind, batch in batches.items()}

    def _with_siblings(self, batch: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
        """`batch` with the new siblings of each finished prompt right after it, on its row."""
        out = []
        for seq, row in batch:
            out.append((seq, row))
            req = seq.request
            if req.params.n > 1 and not req.forked:  # its prompt is done: the siblings start
                try:
                    out += [(child, row) for child in self._fork(seq)]
                except Exception as exc:  # noqa: BLE001 - contained to this request
                    self.fail(req, exc)
        return out

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """The n - 1 siblings of a sequence whose prompt was just computed."""
        req = parent.request
        req.forked = True
        children = []
        for index in range(1, req.params.n):
            child = parent.fork(index)
            self.block_manager.fork(parent, child)
            self.start_sequence(child)
            req.sequences.append(child)
            self.scheduler.add_running(child)
            children.append(child)
        return children

    # -- after the handlers: their results --------------------------------------------------
    def update_from_output(self, results: StepResults) -> None:
        """Applies a step's computed results: failures first, then tokens, beams, pools."""
        for req, exc in results.failed.values():
            self.fail(req, exc)
        now = time.time()
        for seq, sampled in results.sampled:
            if not seq.request.errored:  # else a sibling of this sample failed
                self._append(seq, sampled, now)
        for step in results.beams:
            if not step.request.errored:
                try:
                    self._next_beams(step)
                except Exception as exc:  # noqa: BLE001 - contained to this search
                    self.fail(step.request, exc)
        for seq, pooled in results.pooled:
            req = seq.request
            if req.errored:
                continue
            req.pooled = pooled
            req.metrics.first_token_time = req.metrics.last_token_time = now
            seq.finish_reason = "stop"
            self.scheduler.finish(seq)

    def _append(self, seq: Sequence, sampled: tuple, now: float) -> None:
        """Adds a sampled token (detokenize, stop checks); finishes the sequence if it stops."""
        m = seq.request.metrics
        m.first_token_time = m.first_token_time or now
        m.last_token_time = now
        try:
            self.outputs.append_token(seq, *sampled)
        except Exception as exc:  # noqa: BLE001 - e.g. detokenization: this request only
            self.fail(seq.request, exc)
            return
        self.generation_tokens_total += 1
        if seq.finish_reason is not None:
            self.scheduler.finish(seq)

    def _next_beams(self, step: NextBeams) -> None:
        """The next beams: forks of their parents plus one token; parents left behind end."""
        req, old = step.request, step.request.sequences
        req.forked = True  # the search holds its slots from now on
        by_index: dict[int, Sequence] = {}  # new beam index -> its sequence
        for b, parent in enumerate(old):
            kids = [i for i, p in enumerate(step.parents) if p == b]
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
                by_index[i] = child
            by_index[kids[0]] = parent
        beams = [by_index[i] for i in range(len(step.parents))]
        for index, (seq, token) in enumerate(zip(beams, step.tokens)):
            seq.index = index
            seq.token_ids.append(token)
        req.sequences = beams
        self.generation_tokens_total += len(beams)
        if step.done:
            for seq in beams:
                self.scheduler.finish(seq)
