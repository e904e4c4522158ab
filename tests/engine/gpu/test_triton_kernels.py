"""The Triton kernels of `workbench/engine/gpu/triton/`, on CPU under Triton's interpreter.

Paged attention over shuffled block tables (decodes and prefill chunks with cached context in
one launch; grouped-query heads; head sizes that are not powers of two; sliding windows with
released blocks; soft-capping) against the engine's own torch attention (`attention.attend` on
the gathered context): float32 within 1e-5 relative (2e-6 absolute), bfloat16 and float16
within one rounding of the float32 attention of the same inputs (plus the same 2e-6). The fused ops against torch's formulas: float32 within
1e-6 relative, 16-bit results within one ulp (rotary + KV write and the residual sums exact).
Under the interpreter: what the kernels compute; what only CUDA's compiler sees is checked by
compiling them for sm_90 (`test_kernels_compile_for_cuda_without_a_gpu`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# before triton and the kernel modules are imported, and for the rest of the session: triton
# reads it as each `triton.jit` kernel is defined, its own lazily imported modules included
# (they assert it holds still), so it cannot be put back; no other test runs Triton
os.environ["TRITON_INTERPRET"] = "1"

import pytest

pytest.importorskip("triton")

import torch
import torch.nn.functional as F

from workbench.engine.gpu import triton as wb_triton
from workbench.engine.gpu.triton import ops
from workbench.engine.gpu.triton.attention import paged_attention
from workbench.engine.step.attention import AttentionContext, PrefillChunk, attend
from workbench.engine.step.decoder import _rms_norm, _rotate, _signed_sin

BLOCK_SIZE = 4
SIXTEEN = (torch.bfloat16, torch.float16)


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of `dtype`'s values at each of x's (float32): one rounding's worth."""
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(x.float().abs().clamp(min=info.tiny))
    return torch.ldexp(torch.full_like(x, info.eps, dtype=torch.float32), exponent - 1)


def assert_within_rounding(got: torch.Tensor, expected: torch.Tensor, atol: float = 0.0):
    """got (16-bit) at most one spacing of its dtype from `expected` (any dtype), plus `atol`
    (where `expected` is itself a float32 computation in another order)."""
    err = (got.float() - expected.float()).abs()
    bound = ulp(expected.float(), got.dtype) + atol
    assert torch.isfinite(got).all()
    assert (err <= bound).all(), f"{int((err > bound).sum())} off by up to {err.max():.3g}"


# -- paged attention --------------------------------------------------------------------------

class Step:
    """A step's sequences over a paged cache: each (cached, new) pair is a sequence with
    `cached` positions in the cache and `new` queries this step (new == 1: a decode), their
    blocks drawn shuffled from the whole cache; the keys and values of every used block random,
    every other block NaN (a read through a wrong slot shows). Decodes first, as the runner
    packs them."""

    def __init__(self, seqs, dtype, heads=6, kv_heads=2, head_dim=64, num_blocks=64,
                 window=None, seed=0):
        gen = torch.Generator().manual_seed(seed)
        assert [n == 1 for _, n in seqs] == sorted((n == 1 for _, n in seqs), reverse=True)
        self.seqs, self.window, self.dtype = seqs, window, dtype
        slots = num_blocks * BLOCK_SIZE
        self.k_cache = torch.full((slots, kv_heads, head_dim), float("nan"))
        self.v_cache = torch.full((slots, kv_heads, head_dim), float("nan"))
        free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()  # block 0 apart
        self.tables = []
        for cached, new in seqs:
            table = [free.pop() for _ in range(-(-(cached + new) // BLOCK_SIZE))]
            self.tables.append(table)
        for block in [0] + [b for table in self.tables for b in table]:  # 0: padding reads
            span = slice(block * BLOCK_SIZE, (block + 1) * BLOCK_SIZE)
            self.k_cache[span] = torch.randn(BLOCK_SIZE, kv_heads, head_dim, generator=gen)
            self.v_cache[span] = torch.randn(BLOCK_SIZE, kv_heads, head_dim, generator=gen)
        if window is not None:  # blocks wholly out of every query's window: released
            for (cached, _), table in zip(seqs, self.tables):
                for i, block in enumerate(table):
                    if (i + 1) * BLOCK_SIZE <= cached - window + 1:
                        table[i] = -1
                        span = slice(block * BLOCK_SIZE, (block + 1) * BLOCK_SIZE)
                        self.k_cache[span] = float("nan")
                        self.v_cache[span] = float("nan")
        tokens = sum(n for _, n in seqs)
        # the queries: a slice of the fused projection's heads, rows strided as the loop's
        wide = torch.randn(tokens, heads + 2 * kv_heads, head_dim, generator=gen)
        self.q = wide.to(dtype)[:, :heads]
        self.k_cache, self.v_cache = self.k_cache.to(dtype), self.v_cache.to(dtype)
        width = max(len(t) for t in self.tables)
        self.block_tables = torch.tensor([t + [0] * (width - len(t)) for t in self.tables],
                                         dtype=torch.int32)
        lengths = [c + n for c, n in seqs]
        self.query_start = torch.tensor([0] + [n for _, n in seqs]).cumsum(0).to(torch.int32)
        self.seq_lens = torch.tensor(lengths, dtype=torch.int32)

    def slots(self, i: int, length: int) -> torch.Tensor:
        """Cache slots of sequence i's first `length` positions (as `ModelRunner._slots`)."""
        return torch.tensor([max(self.tables[i][p // BLOCK_SIZE], 0) * BLOCK_SIZE
                             + p % BLOCK_SIZE for p in range(length)])

    def context(self, k_cache, v_cache) -> AttentionContext:
        """The engine's `AttentionContext` of the step, as `ModelRunner._prepare` builds it."""
        decodes = [i for i, (_, n) in enumerate(self.seqs) if n == 1]
        lengths = [c + n for c, n in self.seqs]
        decode_slots = decode_mask = decode_lengths = None
        lmax = max((lengths[i] for i in decodes), default=0)
        if decodes:
            decode_slots = torch.zeros(len(decodes), lmax, dtype=torch.long)
            for row, i in enumerate(decodes):
                decode_slots[row, :lengths[i]] = self.slots(i, lengths[i])
            decode_lengths = torch.tensor([lengths[i] for i in decodes])
            decode_mask = torch.arange(lmax)[None] < decode_lengths[:, None]
        chunks, start = [], len(decodes)
        for i, (c, n) in enumerate(self.seqs):
            if n > 1:
                mask = None
                if c > 0:
                    mask = torch.arange(c + n)[None] <= torch.arange(c, c + n)[:, None]
                chunks.append(PrefillChunk(start, n, self.slots(i, c + n), mask))
                start += n
        return AttentionContext(
            slot_mapping=torch.zeros(0, dtype=torch.long), num_decode=len(decodes),
            decode_slots=decode_slots, decode_mask=decode_mask, prefills=chunks,
            kv_caches=[(k_cache, v_cache)], decode_lengths=decode_lengths,
            max_decode_length=lmax)

    def reference(self, scale, softcap=None) -> torch.Tensor:
        """The engine's torch attention on the gathered contexts, in float32."""
        ctx = self.context(self.k_cache.float(), self.v_cache.float())
        return attend(ctx, 0, self.q.float(), None, None, scale, self.window, softcap)

    def kernel(self, scale, softcap=None, **kwargs) -> torch.Tensor:
        return paged_attention(self.q, self.k_cache, self.v_cache, self.block_tables,
                               self.query_start, self.seq_lens, BLOCK_SIZE, scale, self.window,
                               softcap, block_n=16, **kwargs)


ATOL = 2e-6  # float32 attention in two orders (softmax sums, products): measured within 1e-6

# decodes of 1 to 40 positions, a fresh prefill, two chunks after cached context
MIXED = [(0, 1), (8, 1), (22, 1), (39, 1), (0, 7), (13, 6), (29, 5)]


def check(step: Step, scale: float, softcap: float | None = None) -> None:
    got = step.kernel(scale, softcap)
    expected = step.reference(scale, softcap)
    assert got.dtype == step.dtype and got.shape == step.q.shape
    if step.dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=ATOL)
    else:  # the float32 attention's own difference, then one rounding
        assert_within_rounding(got, expected, atol=ATOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(2, 2, 64), (6, 2, 48)])
def test_paged_attention_decodes_and_chunks_over_shuffled_blocks(dtype, heads, kv_heads,
                                                                 head_dim):
    """Decodes and prefill chunks (fresh, and after cached context spanning several blocks) in
    one launch; one or three query heads per KV head; a head size that is not a power of two."""
    step = Step(MIXED, dtype, heads, kv_heads, head_dim)
    check(step, head_dim ** -0.5)


def test_paged_attention_head_size_80_int64_tables_and_other_scaling():
    """Three query heads on one KV head of 80, the runner's int64 index tensors."""
    step = Step([(5, 1), (30, 1), (11, 9)], torch.float32, 3, 1, 80, seed=1)
    step.block_tables, step.query_start, step.seq_lens = (
        step.block_tables.long(), step.query_start.long(), step.seq_lens.long())
    check(step, 0.3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_sliding_window_skips_released_blocks(dtype):
    """Each query sees its last 6 positions; blocks out of every window are released (-1 in
    the table, NaN in the cache): the kernel never reads them."""
    step = Step(MIXED, dtype, 6, 2, 48, window=6, seed=2)
    assert (step.block_tables < 0).any()
    check(step, 48 ** -0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_softcap(dtype):
    """Scores soft-capped (`softcap * tanh(s / softcap)`, Gemma 2's), alone and in a window."""
    step = Step(MIXED, dtype, 2, 2, 64, seed=3)
    check(step, 0.5, softcap=3.0)  # scores of a few units: the cap bends them
    windowed = Step(MIXED, dtype, 6, 2, 64, window=5, seed=4)
    check(windowed, 0.5, softcap=3.0)


def test_paged_attention_padded_batch_writes_only_its_rows():
    """A captured graph's padding: a sequence with no queries and no context, and query rows
    past the last sequence, are left alone in a static `out` buffer."""
    step = Step([(9, 1), (3, 5)], torch.float32, 2, 1, 64, seed=5)
    expected = step.reference(0.125)
    q_padded = torch.cat([step.q, torch.randn(3, *step.q.shape[1:])])  # 3 padding rows
    out = torch.full_like(q_padded, 7.0)
    query_start = torch.cat([step.query_start, step.query_start[-1:]])  # an empty sequence
    seq_lens = torch.cat([step.seq_lens, torch.zeros(1, dtype=torch.int32)])
    tables = torch.cat([step.block_tables, torch.zeros_like(step.block_tables[:1])])
    got = paged_attention(q_padded, step.k_cache, step.v_cache, tables, query_start, seq_lens,
                          BLOCK_SIZE, 0.125, out=out, block_n=16)
    assert got is out
    torch.testing.assert_close(out[:6], expected, rtol=1e-5, atol=ATOL)
    assert (out[6:] == 7.0).all()


def test_paged_attention_refuses_mismatched_inputs():
    step = Step([(3, 1)], torch.float32, 2, 2, 16)
    with pytest.raises(ValueError, match="k_cache"):
        paged_attention(step.q, step.k_cache.to(torch.bfloat16), step.v_cache,
                        step.block_tables, step.query_start, step.seq_lens, BLOCK_SIZE, 1.0)
    with pytest.raises(ValueError, match="query_start"):
        paged_attention(step.q, step.k_cache, step.v_cache, step.block_tables,
                        step.query_start[:1], step.seq_lens, BLOCK_SIZE, 1.0)
    with pytest.raises(ValueError, match="share"):
        paged_attention(torch.randn(1, 3, 16), step.k_cache, step.v_cache, step.block_tables,
                        step.query_start, step.seq_lens, BLOCK_SIZE, 1.0)


# -- fused ops -----------------------------------------------------------------------------------

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def rows(m: int, width: int, dtype: torch.dtype, gen: torch.Generator, scale: float = 1.0):
    """[m, width] random, every row a slice of a wider one (strided rows, as the loop's)."""
    return (torch.randn(m, width + 8, generator=gen) * scale).to(dtype)[:, 3:3 + width]


def assert_matches(got: torch.Tensor, expected: torch.Tensor) -> None:
    """float32 within 1e-6 relative; 16-bit within one rounding."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)
    else:
        assert_within_rounding(got, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [48, 64])
def test_add_rms_norm(dtype, size):
    """The sum exactly torch's add; the norm transformers' RMSNorm (`decoder._rms_norm`)."""
    gen = torch.Generator().manual_seed(size)
    hidden, delta = rows(5, size, dtype, gen, 3.0), rows(5, size, dtype, gen)
    weight = (torch.rand(size, generator=gen) + 0.5).to(dtype)
    total, normed = ops.add_rms_norm(hidden, delta, weight, 1e-6)
    assert torch.equal(total, hidden + delta)
    assert_matches(normed, _rms_norm(hidden + delta, weight, 1e-6))
    same, alone = ops.add_rms_norm(hidden, None, weight, 1e-5)
    assert same is hidden
    assert_matches(alone, _rms_norm(hidden, weight, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 2, 64), (3, 1, 48)])
def test_rope_write_kv(dtype, heads, kv_heads, head_dim):
    """Queries rotated as `decoder._rotate`, bit for bit; rotated keys and the values written
    at the step's slots (a negative slot: nothing), every other slot untouched."""
    gen = torch.Generator().manual_seed(head_dim)
    t, width = 5, (heads + 2 * kv_heads) * head_dim
    qkv = rows(t, width, dtype, gen)
    angles = torch.rand(t, head_dim // 2, generator=gen) * 6
    cos = torch.cat([angles.cos()] * 2, dim=-1).to(dtype)
    sin = _signed_sin(torch.cat([angles.sin()] * 2, dim=-1).to(dtype))
    slots = torch.tensor([9, 2, -1, 14, 5])
    k_cache = torch.randn(16, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(16, kv_heads, head_dim, generator=gen).to(dtype)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    q = ops.rope_write_kv(qkv, cos, sin, slots, k_cache, v_cache, heads, kv_heads)
    qk = _rotate(qkv[:, :(heads + kv_heads) * head_dim].reshape(t, heads + kv_heads, head_dim),
                 cos.unsqueeze(1), sin.unsqueeze(1))
    v = qkv[:, (heads + kv_heads) * head_dim:].reshape(t, kv_heads, head_dim)
    written = slots >= 0
    assert_matches(q, qk[:, :heads])
    assert_matches(k_cache[slots[written]], qk[written, heads:])
    assert torch.equal(v_cache[slots[written]], v[written])
    untouched = torch.ones(16, dtype=torch.bool)
    untouched[slots[written]] = False
    assert torch.equal(k_cache[untouched], k_before[untouched])
    assert torch.equal(v_cache[untouched], v_before[untouched])
    # each product and the sum rounded as torch's (no FMA: `enable_fp_fusion=False`): the bits
    assert torch.equal(q, qk[:, :heads])
    assert torch.equal(k_cache[slots[written]], qk[written, heads:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    """`silu(gate) * up` of the fused row, gates from -20 to 20 (silu's tails too)."""
    gen = torch.Generator().manual_seed(7)
    gate_up = rows(6, 2 * 40, dtype, gen, 6.0)
    gate_up[0, :40] = torch.linspace(-20, 20, 40).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    assert_matches(ops.silu_mul(gate_up, block=16), F.silu(gate) * up)  # several column blocks


def test_ops_refuse_mismatched_inputs():
    with pytest.raises(ValueError, match="weight"):
        ops.add_rms_norm(torch.randn(2, 8), None, torch.randn(8, dtype=torch.bfloat16), 1e-6)
    with pytest.raises(ValueError, match="qkv"):
        ops.rope_write_kv(torch.randn(2, 40), torch.randn(2, 8), torch.randn(2, 8),
                          torch.zeros(2, dtype=torch.long), torch.zeros(4, 1, 8),
                          torch.zeros(4, 1, 8), 2, 1)
    with pytest.raises(ValueError, match="int64"):
        ops.silu_mul(torch.zeros(2, 8, dtype=torch.int64))


def test_available_reads_the_interpreter_switch(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert wb_triton.available("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not wb_triton.available("cpu")
    assert wb_triton.available("cuda")  # compiled there (whether a GPU is present or not)


@pytest.mark.slow
def test_kernels_compile_for_cuda_without_a_gpu(tmp_path):
    """Every launch the public functions make, in each dtype, compiled by Triton's compiler
    and ptxas for sm_90 (`tests/engine/gpu/triton_compile.py`: what the interpreter never sees,
    such as loop-carried types), in a process without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled here, not found in a cache
    result = subprocess.run([sys.executable, "-m", "tests.engine.gpu.triton_compile", "90"],
                            capture_output=True, text=True, env=env, timeout=600,
                            cwd=Path(__file__).resolve().parents[3])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "30 launches compiled for sm_90" in result.stdout
