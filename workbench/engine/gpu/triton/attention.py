"""Paged attention over the block tables as one Triton kernel, for the CUDA path.

On CUDA the engine's attention (`engine/step/attention.py`'s `attend`) gathers every decode's and
every prefill chunk's context out of the cache into padded contiguous tensors, in every layer,
then calls SDPA (or the eager soft-capped formula) once for the decodes and once per chunk.
`paged_attention` instead reads each sequence's keys and values in place through its block
table, for the whole step's packed queries in one launch: decodes (one query each) and prefill
chunks (their new queries against the cached context and themselves, causal) alike, several
query heads per KV head, an optional sliding window and soft-capped scores, in float32,
bfloat16 or float16 (online softmax in float32, the output rounded once).

Each program takes one KV head and a block of `BLOCK_M` rows: up to `BLOCK_Q` consecutive query
tokens of one sequence times that head's `G` query heads (vLLM's unified Triton attention lays
its rows out the same way), and walks the sequence's keys from the first its rows can see
(window) to the last (causal) in tiles of `BLOCK_N` key positions, each position's slot looked
up in the block table. Both products are `tl.dot`s in float32: bfloat16 and float16 values are
exact in TF32, so 16-bit caches run on TF32 tensor cores with exact products (the
probabilities rounded to TF32); float32 ones in IEEE float32. (Triton's interpreter reads
16-bit `tl.dot` operands as integers, so this upcast is also what lets the CPU tests run the
same code.)

Graph capture: the grid is `(T // BLOCK_Q + B, Hkv)`, from the shapes of q and of the per
sequence tensors only (an upper bound on the query blocks; a program past its sequence's
queries returns at once); how far each program reads is its own sequence's length, a loop
bound inside the kernel, so no maximum context length reaches the host and nothing is read
back (no `.item()`, no host sync). Padded sequences (no queries, length 0) cost one early
return per program.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from workbench.engine.gpu.triton.rounding import round_to

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)


@triton.jit
def _tanh(x):
    """tanh in float32 from exp (no tanh in Triton's core language, libdevice's has no
    interpreter)."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = tl.div_rn(1.0 - e, 1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _sequence_of(query_start_ptr, block, num_seqs, BLOCK_Q: tl.constexpr):
    """The sequence whose query blocks hold global block `block`: sequence b's first one is
    query_start[b] // BLOCK_Q + b (strictly increasing in b), so a binary search finds it."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(query_start_ptr + mid) // BLOCK_Q + mid
        if first <= block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _paged_attention_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, query_start_ptr,
        seq_lens_ptr, scale, softcap, window, num_seqs, block_size,
        stride_q_token, stride_q_head, stride_o_token, stride_o_head, stride_k_slot,
        stride_k_head, stride_v_slot, stride_v_head, stride_table,
        G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, USE_WINDOW: tl.constexpr,
        USE_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    block = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _sequence_of(query_start_ptr, block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_ptr + seq)
    q_len = tl.load(query_start_ptr + seq + 1) - q_start
    local = block - (q_start // BLOCK_Q + seq)  # this program's query block in its sequence
    if local * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)  # cached context + this step's queries
    context = seq_len - q_len  # the position of query 0

    # rows: BLOCK_Q query tokens x the G query heads of this KV head
    rows = tl.arange(0, BLOCK_M)
    query = local * BLOCK_Q + rows // G  # [M] query index within the sequence's step
    head = kv_head * G + rows % G
    row_ok = (rows < BLOCK_Q * G) & (query < q_len)
    position = context + query  # [M] each row's position: it sees keys 0 .. position
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    token = (q_start + query).to(tl.int64)
    q = tl.load(q_ptr + token[:, None] * stride_q_token + head[:, None] * stride_q_head
                + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    q = q.to(tl.float32)  # [M, D]

    # keys from the first any row's window holds to the last any row sees
    last = context + tl.minimum((local + 1) * BLOCK_Q, q_len)  # exclusive
    first = 0
    if USE_WINDOW:
        first = tl.maximum(context + local * BLOCK_Q - window + 1, 0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    keys = tl.arange(0, BLOCK_N)
    table = block_tables_ptr + seq.to(tl.int64) * stride_table
    for start in range(first, last, BLOCK_N):
        key = start + keys  # [N] key positions
        key_ok = key < last
        # never a released block: those lie wholly before `first`
        entry = tl.load(table + key // block_size, mask=key_ok, other=0)
        slot = entry.to(tl.int64) * block_size + key % block_size
        kv_mask = key_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + slot[:, None] * stride_k_slot + kv_head * stride_k_head
                    + d[None, :], mask=kv_mask, other=0.0).to(tl.float32)  # [N, D]
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # [M, N]
        if USE_SOFTCAP:
            s = _tanh(s / softcap) * softcap
        seen = key_ok[None, :] & (key[None, :] <= position[:, None])
        if USE_WINDOW:
            seen = seen & (key[None, :] > position[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw nothing yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + slot[:, None] * stride_v_slot + kv_head * stride_v_head
                    + d[None, :], mask=kv_mask, other=0.0).to(tl.float32)  # [N, D]
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(out_ptr + token[:, None] * stride_o_token + head[:, None] * stride_o_head
             + d[None, :], round_to(out, out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, query_start: torch.Tensor,
                    seq_lens: torch.Tensor, block_size: int, scale: float,
                    window: int | None = None, softcap: float | None = None,
                    out: torch.Tensor | None = None, block_n: int = 32) -> torch.Tensor:
    """Every query of the step against its sequence's context, read through its block table.

    q: [T, Hq, D], the step's packed queries (each sequence's consecutive, rows may be
    strided); k_cache, v_cache: [num_blocks * block_size, Hkv, D], the layer's cache with this
    step's keys and values written already; block_tables: [B, max_blocks] int32/int64 (entry i:
    the block of positions i * block_size ..; entries wholly before the first query's window,
    released blocks, are never read: -1 there is fine);
    query_start: [B + 1] int32/int64, sequence b's queries are rows query_start[b] ..
    query_start[b + 1] of q; seq_lens: [B], each sequence's length with this step's tokens
    (query i of sequence b sits at position seq_lens[b] - q_len + i and sees keys 0 .. that
    position, its last `window` of them with a window; scores `softcap * tanh(s / softcap)`
    with a softcap) -> [T, Hq, D] in q's dtype (into `out` when given: a captured graph's
    static buffer). `block_n`: key positions per tile (at least 16, the tensor cores' least).

    Replaces, on CUDA, `attention.attend`'s reads (`_attend_decodes`, `_attend_chunk`: the
    gathered contexts and their SDPA or eager calls) and the runner's padded slot tables
    (`ModelRunner._decode_context`, each `PrefillChunk`'s slots and mask): the GPU wiring has
    `ModelRunner._prepare` build block_tables, query_start and seq_lens once per step (for
    decodes first, then prefill chunks, the packed order) into the `AttentionContext`, and
    `attend` call this once per layer after the KV write, with the layer's scaling, window and
    softcap.
    """
    t, hq, d = q.shape
    _check(q, k_cache, v_cache, block_tables, query_start, seq_lens, block_size, block_n)
    hkv = k_cache.shape[1]
    g = hq // hkv
    if out is None:
        out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(f"out must be {tuple(q.shape)} in {q.dtype} with contiguous heads")
    block_m = max(16, triton.next_power_of_2(g))
    block_q = block_m // g
    num_seqs = seq_lens.shape[0]
    grid = (t // block_q + num_seqs, hkv)
    if t == 0 or num_seqs == 0:
        return out
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out, block_tables, query_start, seq_lens, scale,
        1.0 if softcap is None else softcap, 0 if window is None else window, num_seqs,
        block_size, q.stride(0), q.stride(1), out.stride(0), out.stride(1), k_cache.stride(0),
        k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), block_tables.stride(0),
        G=g, HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_M=block_m,
        BLOCK_Q=block_q, BLOCK_N=block_n, USE_WINDOW=window is not None,
        USE_SOFTCAP=softcap is not None,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", enable_fp_fusion=True)
    return out


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           block_tables: torch.Tensor, query_start: torch.Tensor, seq_lens: torch.Tensor,
           block_size: int, block_n: int) -> None:
    """The shapes, dtypes and layouts `paged_attention` takes (shapes only: no values read,
    nothing synchronised)."""
    t, hq, d = q.shape
    if q.dtype not in DTYPES or q.stride(2) != 1:
        raise ValueError(f"q must be [tokens, heads, head size] in one of {DTYPES} with "
                         f"contiguous heads, not {tuple(q.shape)} in {q.dtype}")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if (cache.dim() != 3 or cache.shape[2] != d or cache.dtype != q.dtype
                or cache.stride(2) != 1 or cache.shape[1:] != k_cache.shape[1:]
                or cache.shape[0] % block_size):
            raise ValueError(f"{name} must be [blocks * {block_size}, KV heads, {d}] in "
                             f"{q.dtype} with contiguous heads, not {tuple(cache.shape)} in "
                             f"{cache.dtype}")
    if hq % k_cache.shape[1]:
        raise ValueError(f"{hq} query heads do not share {k_cache.shape[1]} KV heads evenly")
    b = seq_lens.shape[0]
    for name, x, shape in (("block_tables", block_tables, (b, block_tables.shape[-1])),
                           ("query_start", query_start, (b + 1,)), ("seq_lens", seq_lens, (b,))):
        if x.shape != shape or x.dtype not in INDEX_DTYPES or x.stride(-1) != 1:
            raise ValueError(f"{name} must be {list(shape)} in int32 or int64, contiguous, "
                             f"not {tuple(x.shape)} in {x.dtype}")
    if block_size < 1 or block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_size must be positive ({block_size}) and block_n a power of "
                         f"two of at least 16 ({block_n})")
