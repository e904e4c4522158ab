"""Decides, each step, which sequences run and how many of their tokens get computed.

Continuous batching in the manner of vLLM v1: every sequence just has tokens whose KV is not yet
computed, so prefill, chunked prefill, decode and recompute after preemption are one case.
Each step first serves the running sequences (one token each when decoding, a chunk of prompt
otherwise), then admits waiting ones while `max_num_seqs` and `max_num_batched_tokens` allow.
When the KV cache runs out, the lowest-priority running sequence is preempted: its blocks are
freed and it goes back to the front of the waiting queue, to be recomputed later.
Torch-free; unit-tested without a model.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from workbench.engine.requests.block_manager import BlockManager
from workbench.engine.requests.request import Sequence, SequenceStatus


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_tokens: int  # tokens to compute this step, starting at seq.num_computed_tokens

    @property
    def completes_tokens(self) -> bool:
        """True when this step computes the sequence's last token, so it yields logits."""
        return self.seq.num_computed_tokens + self.num_tokens == len(self.seq.token_ids)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)


class Scheduler:
    """Waiting and running queues over a `BlockManager`; see the module docstring."""

    max_loras: int | None = None  # LoRA: at most this many distinct adapters run at once
    # where every layer attends to at most the last `window` positions: blocks before a running
    # sequence's window are released before it is scheduled (`BlockManager.release_before`)
    window: int | None = None
    released_blocks = 0  # how many so far

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool = True, policy: str = "fcfs"):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.policy = policy
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def _key(self, seq: Sequence) -> tuple:
        """Lower runs first: priority (under the priority policy), then arrival."""
        req = seq.request
        if self.policy == "priority":
            return (req.priority, req.arrival_time, seq.index)
        return (req.arrival_time, seq.index)

    # -- queue changes ----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        if self.policy == "priority":  # keep the queue ordered: insert in place, no re-sort
            bisect.insort(self.waiting, seq, key=self._key)
        else:
            self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """A sequence forked from a running one joins the running queue directly."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def finish(self, seq: Sequence) -> None:
        """Removes a finished (or aborted) sequence from whichever queue holds it."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        self.block_manager.free(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- the step ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        self.running.sort(key=self._key)
        for seq in list(self.running):
            if seq not in self.running:  # preempted below to make room for an earlier one
                continue
            if len(out.scheduled) >= self.max_num_seqs or budget == 0:
                break
            num = self._chunk(seq, budget)
            if num == 0:
                continue
            if self.window is not None:  # the next query, at num_computed_tokens, sees W keys
                self.released_blocks += self.block_manager.release_before(
                    seq, seq.num_computed_tokens - self.window + 1)
            if not self._make_room(seq, num, out):
                continue
            out.block_copies += self.block_manager.reserve(seq, num)
            out.scheduled.append(ScheduledSequence(seq, num))
            budget -= num
        if not out.preempted:
            self._admit_waiting(out, budget)
        return out

    def _chunk(self, seq: Sequence, budget: int) -> int:
        num = seq.num_uncomputed_tokens
        if num <= budget:
            return num
        return budget if self.enable_chunked_prefill else 0

    def _make_room(self, seq: Sequence, num: int, out: SchedulerOutput) -> bool:
        """Preempts the latest-ranked running sequences until `seq` fits; False if `seq` went."""
        scheduled = {id(s.seq) for s in out.scheduled}
        while not self.block_manager.can_reserve(seq, num):
            victims = [s for s in self.running if id(s) not in scheduled]
            victim = max(victims, key=self._key)
            self._preempt(victim, out)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        out.preempted.append(seq)

    def _preempt_idle(self, seq: Sequence, num: int, out: SchedulerOutput) -> None:
        """Frees the blocks of running sequences with nothing to compute until `seq` fits.

        Only beams waiting for their siblings' logits are idle; without this, beams holding
        the whole cache would wait forever for a sibling that cannot get a block.
        """
        scheduled = {id(s.seq) for s in out.scheduled}
        idle = [s for s in self.running if s.num_uncomputed_tokens == 0 and id(s) not in scheduled]
        for victim in sorted(idle, key=self._key, reverse=True):
            if self.block_manager.can_reserve(seq, num):
                return
            self.running.remove(victim)
            self.block_manager.free(victim)
            victim.num_computed_tokens = 0
            victim.num_preemptions += 1
            victim.status = SequenceStatus.WAITING
            self.waiting.appendleft(victim)  # parked: its candidates are kept, see below
            self.num_preemptions += 1
            out.preempted.append(victim)

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        bm = self.block_manager
        loras = self._running_loras()
        while self.waiting and budget > 0:
            # a beam parked with its candidates waits for its siblings, not for the model;
            # a sequence of yet another adapter waits while every LoRA slot is taken (vLLM's rule)
            seq = next((s for s in self.waiting if s.beam_candidates is None
                        and self._lora_fits(s, loras)), None)
            if seq is None:
                break
            req = seq.request
            slots = 1 if req.forked else req.max_sequences  # room for siblings / beams
            if len(self.running) + slots > self.max_num_seqs:
                break
            if len(out.scheduled) >= self.max_num_seqs:
                break
            fresh = not seq.block_table
            if fresh:
                cached = bm.allocate_cached_prefix(seq)
                if seq.num_preemptions == 0 and seq.index == 0:
                    req.num_cached_tokens = cached
            num = self._chunk(seq, budget)
            if num and not bm.can_reserve(seq, num):
                self._preempt_idle(seq, num, out)
            if num == 0 or not bm.can_reserve(seq, num):
                if fresh:
                    bm.free(seq)
                    seq.num_computed_tokens = 0
                break
            out.block_copies += bm.reserve(seq, num)
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num))
            budget -= num
            if seq.request.lora_request is not None:
                loras.add(seq.request.lora_request.lora_int_id)

    def _running_loras(self) -> set[int]:
        return {s.request.lora_request.lora_int_id for s in self.running
                if s.request.lora_request is not None}

    def _lora_fits(self, seq: Sequence, loras: set[int]) -> bool:
        lora = seq.request.lora_request
        return (self.max_loras is None or lora is None or lora.lora_int_id in loras
                or len(loras) < self.max_loras)
