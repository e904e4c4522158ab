"""Decode steps replayed from captured graphs: fixed buffers, batch-size buckets, an eager twin.

On a GPU an eager decode step of a small model is mostly kernel launches (about 775 for
SmolLM2) and host work between them. `DecodeGraphs` does what nano-vllm's `capture_cudagraph` /
`run_model` and vLLM's `CUDAGraphRunner` do: for each batch size in `CAPTURE_SIZES` it captures
one decode step that reads only fixed input buffers (token ids, positions, slot mapping,
context lengths, block tables padded to `max_model_len`) and leaves its logits and final hidden
states in tensors of its own. A step of B decodes is written into the rows of the smallest
bucket >= B (the padding rows: token 0 at position 0, context of one slot, all in a scratch
block that no sequence owns, so they write no real K/V), the bucket's graph is replayed, and
the first B rows are read back. Anything else (a prefill row, more rows than the largest
bucket, a request that records or intervenes, LoRA, prompt logprobs or embeddings) is not
taken (`eager_reason`) and runs through `ModelRunner.execute`.

Two back ends capture the same step function over the same buffers: `CudaGraphBackend`
(`torch.cuda.CUDAGraph`; runs on a GPU only and is not wired into the runner yet) and
`EagerBackend`, its CPU twin, whose "replay" calls the step again. On the C kernel (whose
attention reads each context's own length) the twin's logits are the eager runner's bit for
bit; on torch's ops (a GPU's) they are the eager step's of the same padded batch bit for bit,
within 1e-5 of the unpadded one, as eager steps of different batches differ
(`tests/engine/gpu/test_step_graphs.py`). Its step makes no host sync (`tests/engine/host_sync.py`):
what capture requires of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch

from workbench.engine.step.attention import AttentionContext
from workbench.engine.step.decoder import rms_norm

if TYPE_CHECKING:
    from workbench.engine.requests.scheduler import ScheduledSequence, SchedulerOutput

CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 64)  # batch-size buckets, as nano-vllm's and vLLM's

T = TypeVar("T")
StepOutput = tuple[torch.Tensor, torch.Tensor]  # (logits [N, V] float32, hidden [N, H])


def bucket_for(rows: int, sizes: Sequence[int] = CAPTURE_SIZES) -> int | None:
    """The smallest capture size holding `rows` rows, None when none does (or rows < 1)."""
    return next((size for size in sorted(sizes) if size >= rows), None) if rows > 0 else None


class GraphBackend(Protocol):
    def capture(self, step: Callable[[], T]) -> Callable[[], T]:
        """`step` captured; the callable returned replays it and returns its outputs."""
        ...


class EagerBackend:
    """The CPU twin of `CudaGraphBackend`: a replay calls the step on the same buffers."""

    def capture(self, step: Callable[[], T]) -> Callable[[], T]:
        return step


class CudaGraphBackend:
    """`torch.cuda.CUDAGraph` capture and replay, the buckets sharing one memory pool (captured
    largest first, as nano-vllm does). GPU only; not wired into the runner yet."""

    def __init__(self) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("CudaGraphBackend needs a CUDA device")
        self.pool: Any = None  # the graphs' shared memory pool, once the first is captured

    def capture(self, step: Callable[[], T]) -> Callable[[], T]:
        side = torch.cuda.Stream()  # warm-up off the capture: lazy initialisation, autotuning
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = step()  # tensors of the graph's pool, rewritten by every replay
        self.pool = graph.pool()

        def replay() -> T:
            graph.replay()
            return out

        return replay


class DecodeBuffers:
    """The fixed inputs of every captured step: one flat int64 tensor on the device, filled
    from one host staging tensor (pinned on a GPU) by a single non-blocking copy per step.
    Each field is a contiguous run of it, `rows` long (`tables`: [rows, max_blocks])."""

    FIELDS = ("ids", "positions", "slots", "lengths")

    def __init__(self, rows: int, max_blocks: int, device: torch.device):
        self.rows, self.max_blocks = rows, max_blocks
        size = rows * (len(self.FIELDS) + max_blocks)
        pinned = device.type == "cuda"
        self.host = torch.zeros(size, dtype=torch.long, pin_memory=pinned)
        self.device = torch.zeros(size, dtype=torch.long, device=device)
        self.host_views = self._views(self.host)
        self.views = self._views(self.device)

    def _views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        n = self.rows
        views = {name: flat[i * n:(i + 1) * n] for i, name in enumerate(self.FIELDS)}
        views["tables"] = flat[len(self.FIELDS) * n:].view(n, self.max_blocks)
        return views

    def fill(self, decodes: Sequence[ScheduledSequence], rows: int, block_size: int,
             scratch_block: int) -> None:
        """The decodes in the first rows, padding rows up to `rows` (in the scratch block),
        then the copy to the device (the step that reads them is queued after it; the next
        fill comes after the step's tokens were read back, so the copy is done by then)."""
        ids, positions, slots, lengths = [], [], [], []
        tables = self.host_views["tables"]
        tables[:rows] = scratch_block
        for i, s in enumerate(decodes):
            seq, c = s.seq, s.seq.num_computed_tokens
            table = seq.block_table[:self.max_blocks]
            ids.append(seq.token_ids[c])
            positions.append(c)
            # a released block (out of every layer's window) reads as block 0, as `_slots`
            slots.append(max(table[c // block_size], 0) * block_size + c % block_size)
            lengths.append(c + 1)
            tables[i, :len(table)] = torch.tensor(table).clamp_(min=0)
        pad = rows - len(decodes)
        host = self.host_views
        host["ids"][:rows] = torch.tensor(ids + [0] * pad)
        host["positions"][:rows] = torch.tensor(positions + [0] * pad)
        host["slots"][:rows] = torch.tensor(slots + [scratch_block * block_size] * pad)
        host["lengths"][:rows] = torch.tensor(lengths + [1] * pad)
        self.device.copy_(self.host, non_blocking=True)


class DecodeGraphs:
    """Decode steps of a `ModelRunner` through captured graphs (see the module docstring).

    `runner` is the `ModelRunner` (not imported: the runner is the one to import this module);
    `scratch_block` is a KV block that no sequence may own (the block manager keeps it out,
    as vLLM's null block): the padding rows write their K/V there."""

    def __init__(self, runner: Any, backend: GraphBackend, max_model_len: int,
                 scratch_block: int, capture_sizes: Sequence[int] = CAPTURE_SIZES):
        if runner.batch_invariant:
            raise ValueError("DecodeGraphs: not with a batch-invariant runner (its attention is "
                             "built query by query)")
        num_blocks = runner.kv_caches[0][0].shape[0] // runner.block_size
        if not 0 <= scratch_block < num_blocks:
            raise ValueError(f"scratch_block must be one of the {num_blocks} KV blocks, got "
                             f"{scratch_block}")
        self.runner, self.scratch_block = runner, scratch_block
        self.sizes = tuple(sorted(capture_sizes))
        self.max_blocks = -(-max_model_len // runner.block_size)
        self.buffers = DecodeBuffers(self.sizes[-1], self.max_blocks, runner.device)
        self.buffers.fill([], self.sizes[-1], runner.block_size, scratch_block)
        bs = runner.block_size
        # each row's context slots [max_blocks * bs] come from its table: offsets in a block
        self._offsets = torch.arange(bs, device=runner.device)
        self._key_positions = torch.arange(self.max_blocks * bs, device=runner.device)
        self.replays: dict[int, Callable[[], StepOutput]] = {}
        with torch.inference_mode():
            for size in reversed(self.sizes):  # largest first: the others reuse its memory
                self.replays[size] = backend.capture(partial(self.step, size))

    def step(self, rows: int) -> StepOutput:
        """The captured computation: the buffers' first `rows` rows through the runner's
        model, as `ModelRunner.execute` runs a step of decodes. No host sync."""
        runner, v = self.runner, self.buffers.views
        tables = v["tables"][:rows]  # [N, M]
        context = (tables.unsqueeze(2) * runner.block_size + self._offsets).view(rows, -1)
        lengths = v["lengths"][:rows]  # [N]
        ctx = AttentionContext(
            slot_mapping=v["slots"][:rows], num_decode=rows, decode_slots=context,
            decode_mask=self._key_positions.unsqueeze(0) < lengths.unsqueeze(1),  # [N, L]
            prefills=[], kv_caches=runner.kv_caches, decode_lengths=lengths,
            max_decode_length=context.shape[1], c_attention=runner.kernel.ops == "c")
        embeds = runner.embed(v["ids"][:rows].unsqueeze(0))  # [1, N, H]
        hidden = runner.forward(embeds, v["positions"][:rows].unsqueeze(0), ctx)[0]  # [N, H]
        if runner.stack is not None:  # the lean loop leaves the final norm to the caller
            hidden = rms_norm(runner.base.norm, hidden)
        return runner.logits(hidden), hidden

    def eager_reason(self, scheduled: Sequence[ScheduledSequence]) -> str | None:
        """Why this step runs eager instead, None when a graph takes it."""
        if bucket_for(len(scheduled), self.sizes) is None:
            return f"{len(scheduled)} rows: the capture sizes are {self.sizes}"
        if self.runner.lora is not None:
            return "LoRA adapters (their rows' slots are set per step)"
        for s in scheduled:
            seq, c = s.seq, s.seq.num_computed_tokens
            request = seq.request
            if s.num_tokens != 1 or not s.completes_tokens:
                return "a prefill row"
            if request.inside is not None:
                return "a request that records or intervenes"
            if request.prompt_embeds is not None and c < seq.num_prompt_tokens:
                return "a prompt given as embeddings"
            if request.params.prompt_logprobs is not None and c < seq.num_prompt_tokens - 1:
                return "prompt logprobs"
            if c // self.runner.block_size >= self.max_blocks:
                return "a context past max_model_len"
        return None

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> StepOutput | None:
        """A step of decodes through its bucket's graph: (logits [B, V], final hidden states
        [B, H]), row i the scheduled sequence i's (`ModelRunner.execute`'s `LogitRows` of an
        all-decode step hold the same rows in that order); None (nothing done) where
        `eager_reason` says the step runs eager."""
        if self.eager_reason(out.scheduled) is not None:
            return None
        self.runner.copy_blocks(out.block_copies)
        rows = len(out.scheduled)
        size = bucket_for(rows, self.sizes)
        assert size is not None  # eager_reason
        self.buffers.fill(out.scheduled, size, self.runner.block_size, self.scratch_block)
        logits, hidden = self.replays[size]()
        return logits[:rows].clone(), hidden[:rows].clone()  # a replay rewrites them
