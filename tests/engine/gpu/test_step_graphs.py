"""`DecodeGraphs` on its CPU twin (`EagerBackend`): the eager runner's logits bit for bit for
1, 3 (padded to 4) and 5 (padded to 6 on the C kernels, to 8 on torch's ops) decodes, padding
rows writing only the scratch block, the buckets, the steps it leaves to the runner, and a captured step with no host sync."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.engine.helpers import make_seq
from tests.engine.host_sync import forbid_host_sync
from workbench.engine.gpu.step_graphs import (
    CAPTURE_SIZES,
    CudaGraphBackend,
    DecodeGraphs,
    EagerBackend,
    bucket_for,
)
from workbench.engine.requests.scheduler import ScheduledSequence, SchedulerOutput
from workbench.engine.step.runner import ModelRunner
from workbench.inside.resolve import ModelShape
from workbench.models import tiny_model
from workbench.sampling_params import SamplingParams

BLOCK, BLOCKS, SCRATCH, MAX_LEN = 4, 40, 39, 64
REAL_SLOTS = slice(0, SCRATCH * BLOCK)  # the scratch block is the last
SCRATCH_SLOTS = slice(SCRATCH * BLOCK, (SCRATCH + 1) * BLOCK)
PROMPTS = [7, 3, 12, 5, 9]  # prompt lengths of the five sequences: contexts of unequal length
# buckets for the C kernels' twin: a C product's bits depend on its row count's regime (AVX2's
# float32 products: dot products up to six rows, broadcast tiles from seven), so 3 and 5 rows
# are padded to 4 and 6, inside the regime of the unpadded step on every CPU
C_SIZES = (1, 2, 4, 6)


@pytest.fixture(scope="module", params=["auto", "torch"])
def runner(request):
    """A tiny llama's runner: this CPU's kernel and C ops ("auto"), or torch's ops everywhere
    (the ops a GPU runs)."""
    return ModelRunner(tiny_model("llama", seed=0).model, BLOCKS, BLOCK, kernel=request.param)


@pytest.fixture(scope="module")
def c_runner():
    """The runner on this CPU's C kernel and ops: its attention reads each context's own
    length (`c_attention.decode_attention`), whatever the padding."""
    runner = ModelRunner(tiny_model("llama", seed=0).model, BLOCKS, BLOCK)
    if runner.kernel.ops != "c":
        pytest.skip("no C kernel on this CPU")
    return runner


@pytest.fixture(scope="module")
def torch_runner():
    return ModelRunner(tiny_model("llama", seed=0).model, BLOCKS, BLOCK, kernel="torch")


def _decodes(runner: ModelRunner, count: int) -> list[ScheduledSequence]:
    """`count` sequences prefilled through the runner (blocks 0, 1, ...; never the scratch
    block), each with one new token to decode."""
    seqs, next_block = [], 0
    for i, length in enumerate(PROMPTS[:count]):
        seq = make_seq(f"r{i}", [(7 * i + 3 * j) % 500 + 10 for j in range(length)])
        blocks = -(-(length + 1) // BLOCK)
        seq.block_table = list(range(next_block, next_block + blocks))
        next_block += blocks
        runner.execute(SchedulerOutput([ScheduledSequence(seq, length)]))
        seq.num_computed_tokens = length
        seq.token_ids.append(100 + i)
        seqs.append(seq)
    return [ScheduledSequence(seq, 1) for seq in seqs]


def _kv(runner: ModelRunner) -> list[torch.Tensor]:
    return [t.clone() for kv in runner.kv_caches for t in kv]


def _restore(runner: ModelRunner, kv: list[torch.Tensor]) -> None:
    for cache, saved in zip((t for pair in runner.kv_caches for t in pair), kv):
        cache.copy_(saved)


def _clear_scratch(runner: ModelRunner) -> None:
    """What an earlier padded step wrote into the scratch block: gone."""
    for pair in runner.kv_caches:
        for cache in pair:
            cache[SCRATCH_SLOTS] = 7.0


def _both(runner: ModelRunner, decodes: list[ScheduledSequence], eager_out: SchedulerOutput,
          sizes: tuple[int, ...] = CAPTURE_SIZES):
    """(the eager step of `eager_out`: its logits rows and K/V, the twin's step of `decodes`
    through buckets `sizes`: logits, hidden rows and K/V, the K/V before), both from the same
    K/V."""
    graphs = DecodeGraphs(runner, EagerBackend(), MAX_LEN, SCRATCH, sizes)
    _clear_scratch(runner)
    before = _kv(runner)
    eager = runner.execute(eager_out)
    eager_kv = _kv(runner)
    _restore(runner, before)
    got = graphs.execute(SchedulerOutput(list(decodes)))
    assert got is not None
    return eager, eager_kv, got, _kv(runner), before


@pytest.mark.parametrize("count", [1, 3, 5])
def test_twin_is_the_eager_step(c_runner, count):
    """Logits and hidden rows bit for bit (padded within the C products' row regime:
    `C_SIZES`); K/V the eager step's in every block but the scratch one, which only padded steps
    write."""
    decodes = _decodes(c_runner, count)
    eager, eager_kv, (logits, hidden), kv, before = _both(c_runner, decodes,
                                                          SchedulerOutput(list(decodes)), C_SIZES)
    assert logits.shape == (count, c_runner.config.vocab_size)
    assert [eager.last_row[s.seq.seq_id] for s in decodes] == list(range(count))
    assert torch.equal(logits, eager.logits)
    assert eager.hidden is not None and torch.equal(hidden, eager.hidden)
    for mine, theirs, old in zip(kv, eager_kv, before):
        assert torch.equal(mine[REAL_SLOTS], theirs[REAL_SLOTS])
        assert torch.equal(theirs[SCRATCH_SLOTS], old[SCRATCH_SLOTS])
    padded = bucket_for(count, C_SIZES) != count
    assert padded == any(not torch.equal(mine[SCRATCH_SLOTS], old[SCRATCH_SLOTS])
                         for mine, old in zip(kv, before))


def _pad_contexts(runner: ModelRunner, monkeypatch) -> None:
    """The eager runner's decode contexts padded to MAX_LEN slots and masked, as the graphs'."""
    def padded(decodes):
        lengths = torch.tensor([s.seq.num_computed_tokens + 1 for s in decodes])
        table = torch.full((len(decodes), MAX_LEN // BLOCK), SCRATCH)
        for i, s in enumerate(decodes):
            table[i, :len(s.seq.block_table)] = torch.tensor(s.seq.block_table)
        slots = (table.unsqueeze(2) * BLOCK + torch.arange(BLOCK)).view(len(decodes), -1)
        return slots, torch.arange(MAX_LEN) < lengths.unsqueeze(1), lengths, MAX_LEN

    monkeypatch.setattr(runner, "_decode_context", padded)
    monkeypatch.setattr(runner, "_decode_span", lambda decodes: None)


@pytest.mark.parametrize("count", [1, 3, 5])
def test_twin_on_torch_ops_is_the_padded_eager_step(torch_runner, count, monkeypatch):
    """With torch's ops (a GPU's) a row's bits depend on how many rows a product has and how
    far its context is padded, as between eager steps of different batches: the twin is bit for
    bit the eager step of the same padded batch (the padding rows as sequences of token 0 in
    the scratch block, contexts padded to max_model_len), and within 1e-5 of the unpadded one."""
    decodes = _decodes(torch_runner, count)
    pads = []
    for i in range(count, bucket_for(count) or 0):
        seq = make_seq(f"pad{i}", [0])
        seq.block_table = [SCRATCH]
        pads.append(ScheduledSequence(seq, 1))
    plain = torch_runner.execute(SchedulerOutput(list(decodes))).logits  # writes what all do
    _pad_contexts(torch_runner, monkeypatch)
    eager, eager_kv, (logits, hidden), kv, _ = _both(torch_runner, decodes,
                                                     SchedulerOutput(decodes + pads))
    assert torch.equal(logits, eager.logits[:count])
    assert eager.hidden is not None and torch.equal(hidden, eager.hidden[:count])
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(kv, eager_kv))
    torch.testing.assert_close(logits, plain, rtol=0, atol=1e-5)


def test_buckets():
    assert [bucket_for(n) for n in (1, 2, 3, 5, 8, 9, 33, 64)] == [1, 2, 4, 8, 8, 16, 64, 64]
    assert bucket_for(65) is None and bucket_for(0) is None
    assert bucket_for(3, (1, 2)) is None and bucket_for(3, (8, 4)) == 4


def test_each_bucket_is_captured_once(torch_runner):
    captured = []

    class Counting(EagerBackend):
        def capture(self, step):
            captured.append(step()[0].shape[0])  # rows of the step's logits
            return step

    DecodeGraphs(torch_runner, Counting(), MAX_LEN, SCRATCH, capture_sizes=(2, 1, 4))
    assert captured == [4, 2, 1]  # largest first


def _step(runner, count=2, tokens=1):
    decodes = _decodes(runner, count)
    if tokens > 1:  # the first sequence's last prompt tokens again: a prefill chunk
        seq = decodes[0].seq
        seq.num_computed_tokens -= tokens - 1
        decodes[0] = ScheduledSequence(seq, tokens)
    return decodes


def _with(decodes, **params):
    """The first sequence's request with these params (a capture resolved onto the request,
    as the input processor does)."""
    request = decodes[0].seq.request
    request.params = SamplingParams(**params)
    if request.params.wants_inside:
        shape = ModelShape(num_layers=8, hidden_size=1 << 16, num_heads=1, head_dim=1,
                           vocab_size=1 << 20)  # room for any site the tests name
        request.inside = request.params.resolve_inside(shape, 64)
    return decodes


@pytest.mark.parametrize("case, reason", [
    (lambda r: _step(r, tokens=3), "a prefill row"),
    (lambda r: _step(r, count=5), "5 rows"),
    (lambda r: _with(_step(r), capture=["blocks.0.hook_resid_post"]), "records or intervenes"),
    (lambda r: _with(_step(r), prompt_logprobs=1), "prompt logprobs"),
])
def test_steps_left_to_the_runner(torch_runner, case, reason):
    graphs = DecodeGraphs(torch_runner, EagerBackend(), MAX_LEN, SCRATCH, capture_sizes=(1, 2, 4))
    scheduled = case(torch_runner)
    if reason == "prompt logprobs":  # only while its prompt is computed
        scheduled[0].seq.num_computed_tokens = 2
        scheduled[0].seq.token_ids[3:] = []
    why = graphs.eager_reason(scheduled)
    assert why is not None and reason in why
    assert graphs.execute(SchedulerOutput(scheduled)) is None


def test_lora_is_left_to_the_runner(torch_runner, monkeypatch):
    graphs = DecodeGraphs(torch_runner, EagerBackend(), MAX_LEN, SCRATCH, capture_sizes=(1, 2))
    decodes = _decodes(torch_runner, 2)
    assert graphs.eager_reason(decodes) is None
    monkeypatch.setattr(torch_runner, "_lora", SimpleNamespace())
    assert "LoRA" in (graphs.eager_reason(decodes) or "")


def test_scratch_block_must_be_a_block(torch_runner):
    with pytest.raises(ValueError, match="scratch_block"):
        DecodeGraphs(torch_runner, EagerBackend(), MAX_LEN, BLOCKS)


def test_captured_step_does_not_sync(runner):
    """What a CUDA graph needs of the step: not one host sync, whatever the kernel."""
    graphs = DecodeGraphs(runner, EagerBackend(), MAX_LEN, SCRATCH, capture_sizes=(4,))
    graphs.buffers.fill(_decodes(runner, 3), 4, BLOCK, SCRATCH)
    with torch.inference_mode(), forbid_host_sync():
        logits, _ = graphs.replays[4]()
    assert logits.shape[0] == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="captures CUDA graphs: a GPU even in the GPU check's CPU dry run")
def test_cuda_graphs_are_the_twin():
    """On a GPU: the captured graphs' logits are the twin's (same buffers, same step)."""
    results = []
    for backend in (EagerBackend(), CudaGraphBackend()):
        cuda_runner = ModelRunner(tiny_model("llama", seed=0, device="cuda").model, BLOCKS,
                                  BLOCK)
        decodes = _decodes(cuda_runner, 3)
        graphs = DecodeGraphs(cuda_runner, backend, MAX_LEN, SCRATCH)
        got = graphs.execute(SchedulerOutput(decodes))
        assert got is not None
        results.append(got[0].cpu())
    assert torch.equal(results[0], results[1])
