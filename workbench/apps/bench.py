"""`workbench bench`: our engine against transformers' `generate`, same model, one process.

Each benchmark is a function `(Contenders, BenchConfig) -> dict` of figures; `BENCHMARKS` lists
them in order and `main` runs them all, then adds the peak RSS. Both sides get the same prompt
token ids, generate exactly the same number of tokens (`ignore_eos` / `min_new_tokens`), are
warmed up first, and are timed end to end (prefill included), taking turns; each figure is the
best of `repeats` runs, since these shared machines only ever make a run slower. Ratios are
ours over transformers' from the same run. `--json` prints one JSON object on the last line.

`bench_machine` says what the figures were measured on (`cpu_flags`, `dtype`, `kernel`) and
the single-stream limit of this machine: its memory read bandwidth (a plain reduction over
512 MiB, far beyond any cache, in the bench's process on the thread and OpenMP team that run
the engine's steps, as the stream reads its weights; the median of 15 passes, with their
quartiles `memory_read_gb_s_q1` and `_q3`: the spread) divided by the bytes of weights one
decode step must
read in that dtype (`single_stream_limit_tok_s`; with `--dtype gguf` the bytes of the file's
blocks that a step reads, and of the weights that stay float32); `single_stream_of_limit` is our
single-stream rate's share of it. With `--dtype gguf` (`--gguf-activations float32 | q8`: the
arithmetic of our side, `gguf_activations` in the JSON) `bench_gguf_activations` measures both
arithmetics' single stream and 512-token prefill in one run; transformers runs the float32 model it
dequantized from the same file (what it would load), and the embedding benchmark its own auto
dtype. The bandwidth is a median, not a best: the best pass of a few caught the
moments another session left both cores free.

`peak_rss_mb` is this process's peak, with transformers' copy and a second engine in it;
`engine_peak_rss_mb` is our engine's alone, loaded and generating in a spawned child
(`bench_engine_memory`): what a server's process holds.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from workbench.apps import bench_embed as embed
from workbench.apps import soak
from workbench.apps.bench_embed import EmbedContenders
from workbench.models import shapes
from workbench.models.registry import DEFAULT_MODEL
from workbench.models.shapes import SHAPES
from workbench.sampling_params import BeamSearchParams, SamplingParams

PROMPT = "Once upon a time, in a small village at the edge of a great forest,"
TOPICS = ("the sea", "a robot who learns to paint", "the moon", "a library at midnight", "winter",
          "a dragon and a very small knight", "a city", "a garden that grows in the dark",
          "the desert", "a train", "music heard from far away", "a lighthouse", "mountains",
          "a market on the last day of summer", "the rain", "a clock that runs backwards")


@dataclass(frozen=True)
class BenchConfig:
    """How long and how often to run; `quick()` for a fast smoke run."""

    model: str = DEFAULT_MODEL
    dtype: str = "auto"
    kernel: str = "auto"  # our side's projection kernel (workbench/engine/kernels/projections.py)
    gguf_activations: str = "float32"  # with dtype gguf: "q8", llama.cpp's int8 arithmetic
    threads: int = 2
    tokens: int = 64
    repeats: int = 3
    concurrency: int = 16
    seed: int = 0
    embed_sentences: int = 512  # the embedding benchmark's corpus (workbench/apps/bench_embed.py)

    @classmethod
    def quick(cls, **kwargs: Any) -> "BenchConfig":
        return cls(**{"tokens": 16, "repeats": 1, "embed_sentences": 128, **kwargs})


class Contenders:
    """The two sides, loaded on first use: our `LLM` and a separate transformers copy; or
    given (`theirs` a `LoadedModel`, `ours` an `LLM` on a copy of its own), built elsewhere."""

    def __init__(self, config: BenchConfig, *, theirs: Any = None, ours: Any = None):
        self.config = config
        if theirs is not None:
            self.theirs = theirs  # an instance value takes the cached property's place
        if ours is not None:
            self.ours = ours

    @cached_property
    def theirs(self):
        """A `LoadedModel` for `model.generate` (a copy of its own: our engine may patch its model)."""
        from workbench.models import load_model  # deferred: the loader imports torch

        return load_model(self.config.model, dtype=float_dtype(self.config.dtype))

    @cached_property
    def ours(self):
        from workbench import LLM  # deferred: workbench.llm imports torch

        return LLM(model=self.config.model, dtype=self.config.dtype, kernel=self.config.kernel,
                   seed=self.config.seed, **engine_extras(self.config))

    def both_do_not_fit(self) -> str | None:
        """Why transformers' copy and ours cannot share this process (None: they can): the
        two copies of the weights (and a tenth beside) above the memory available now, less
        ours where it is loaded."""
        import psutil

        from workbench.models.registry import resolve_model

        if "theirs" in self.__dict__:
            return None
        path = resolve_model(self.config.model).path
        size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        free = psutil.virtual_memory().available + (size if "ours" in self.__dict__ else 0)
        if 2.2 * size <= free:
            return None
        return (f"transformers' copy beside ours: 2 x {size / 1e9:.1f} GB of weights and more, "
                f"{free / 1e9:.1f} GB available (bench_load compares them apart)")

    @cached_property
    def embed(self):
        """Both sides of the embedding benchmark, on the default embedding model."""
        return EmbedContenders(dtype=float_dtype(self.config.dtype, "auto"))

    @cached_property
    def tokenizer(self):
        """The model's tokenizer: transformers' side's where it is loaded, else read alone."""
        if "theirs" in self.__dict__:
            return self.theirs.tokenizer
        from transformers import AutoTokenizer  # deferred: transformers is heavy to import

        from workbench.models.registry import resolve_model

        return AutoTokenizer.from_pretrained(resolve_model(self.config.model).path,
                                             local_files_only=True)

    def prompt_ids(self, count: int) -> list[list[int]]:
        """`count` prompts' token ids: the story prompt, then one per topic."""
        tokenizer = self.tokenizer
        texts = [PROMPT] if count == 1 else [f"Write a short story about {TOPICS[i % len(TOPICS)]}."
                                              for i in range(count)]
        return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


# -- the two sides of one measurement: each returns the number of tokens it generated -------

def hf_generate(lm, prompts: list[list[int]], tokens: int, *, sample: bool, seed: int = 0,
                **generate_kwargs: Any) -> int:
    """transformers' `generate` on a left-padded batch; exactly `tokens` new tokens per prompt
    (`generate_kwargs`: more of `generate`'s own, a cache implementation say)."""
    import torch  # deferred: torch is heavy; `workbench bench --help` stays light

    tokenizer = lm.tokenizer
    batch = tokenizer.pad({"input_ids": prompts}, padding=True, padding_side="left",
                          return_tensors="pt").to(lm.device)
    sampling = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if sample else \
        dict(do_sample=False)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = lm.model.generate(**batch, max_new_tokens=tokens, min_new_tokens=tokens,
                                pad_token_id=tokenizer.pad_token_id, **sampling,
                                **generate_kwargs)  # [B, T + tokens]
    return (out.shape[1] - batch["input_ids"].shape[1]) * out.shape[0]


def ours_generate(llm, prompts: list[list[int]], tokens: int, *, sample: bool, seed: int = 0) -> int:
    """Our engine with every prompt submitted at once; exactly `tokens` new tokens per prompt."""
    params = [SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=1.0 if sample else 0.0,
                             seed=seed + i if sample else None) for i in range(len(prompts))]
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    return sum(len(out.outputs[0].token_ids) for out in outs)


def tokens_per_second(run: Callable[[], int]) -> float:
    """Tokens per second of one call of `run` (which returns the number of tokens it made)."""
    start = time.perf_counter()
    count = run()
    return count / (time.perf_counter() - start)


def compare(name: str, side: Contenders, config: BenchConfig, prompts: list[list[int]],
            sample: bool) -> dict[str, float]:
    """`NAME_tok_s`, `hf_NAME_tok_s` and `NAME_ratio` for one workload.

    Both sides are warmed up, then run in turn `repeats` times (so a burst of load from
    elsewhere hits both alike); each keeps its best rate. Each of our runs starts with the
    prefix cache reset: transformers' `generate` computes the prompts every time, and so does
    ours then.
    """
    def ours(tokens: int) -> int:
        side.ours.llm_engine.reset_prefix_cache()
        return ours_generate(side.ours, prompts, tokens, sample=sample, seed=config.seed)

    theirs = lambda tokens: hf_generate(side.theirs, prompts, tokens, sample=sample, seed=config.seed)
    ours(4), theirs(4)  # warm-up: first-call allocations, lazy initialisation
    ours_rate = theirs_rate = 0.0
    for _ in range(config.repeats):
        ours_rate = max(ours_rate, tokens_per_second(lambda: ours(config.tokens)))
        theirs_rate = max(theirs_rate, tokens_per_second(lambda: theirs(config.tokens)))
    return {f"{name}_tok_s": round(ours_rate, 2), f"hf_{name}_tok_s": round(theirs_rate, 2),
            f"{name}_ratio": round(ours_rate / theirs_rate, 3)}


# -- the benchmarks ------------------------------------------------------------------------

def bench_single_stream(side: Contenders, config: BenchConfig) -> dict[str, float]:
    """One prompt, greedy, `tokens` tokens."""
    return compare("single_stream", side, config, side.prompt_ids(1), sample=False)


def bench_concurrent16(side: Contenders, config: BenchConfig) -> dict[str, float]:
    """`concurrency` prompts (16) sampled at temperature 1 (seeded), all submitted at once / one
    padded batch; the figures are named after the count (`concurrent16_tok_s`)."""
    return compare(f"concurrent{config.concurrency}", side, config,
                   side.prompt_ids(config.concurrency), sample=True)


def long_prompt(side: Contenders, length: int = 512) -> list[int]:
    """A prompt of `length` tokens: the story prompt's, repeated."""
    story = side.prompt_ids(1)[0]
    return (story * (length // len(story) + 1))[:length]


def bench_prefill512(side: Contenders, config: BenchConfig) -> dict[str, float]:
    """A 512-token prompt: our prefill (one token out, the prefix cache reset) against
    transformers' forward over the same tokens (the last position's logits only, as ours), in
    turn, best of `repeats` (`prefill512_ratio`)."""
    import torch  # deferred: torch is heavy; `workbench bench --help` stays light

    prompt = long_prompt(side)
    ids = torch.tensor([prompt])

    def ours() -> int:
        side.ours.llm_engine.reset_prefix_cache()
        ours_generate(side.ours, [prompt], 1, sample=False)
        return len(prompt)

    def theirs() -> int:
        with torch.inference_mode():
            side.theirs.model(ids, logits_to_keep=1)
        return len(prompt)

    ours(), theirs()  # warm-up
    ours_rate = theirs_rate = 0.0
    for _ in range(config.repeats):
        ours_rate = max(ours_rate, tokens_per_second(ours))
        theirs_rate = max(theirs_rate, tokens_per_second(theirs))
    return {"prefill512_tok_s": round(ours_rate, 2), "hf_prefill512_tok_s": round(theirs_rate, 2),
            "prefill512_ratio": round(ours_rate / theirs_rate, 3)}


def bench_load(side: Contenders, config: BenchConfig) -> dict[str, Any]:
    """Loading, each side in a spawned child of its own (a fresh interpreter, its imports done
    before the clock starts), one after the other: `LLM(model)` against transformers'
    `from_pretrained` in the same dtype (`load_s`, `hf_load_s`, `load_time_ratio`), and to the
    first token of the story prompt (`first_token_s`, `hf_first_token_s`,
    `first_token_time_ratio`: transformers maps a checkpoint and reads it on its first
    forward, ours reads it into the kernels' layouts at load), each after the checkpoint's
    files were read once into the page cache (`read_through`); the resident memory the load
    added (`resident_after_load_mb`, with `resident_over_weights`
    against `weights_mb`, the checkpoint's weights in that dtype) and its peak
    (`peak_load_over_weights`); and a greedy stream of `tokens` tokens on the freshly loaded
    model (`fresh_single_stream_tok_s`, `hf_fresh_single_stream_tok_s`): the figures of a
    model too large for both sides to share one process (`--shape llama-8b`). Where
    transformers' copy in its dtype cannot fit the memory there is (an 8B in float32 on 24 GB,
    which ours serves from the checkpoint's bfloat16), its side is left out:
    `hf_load_skipped` says why."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from workbench.models.registry import resolve_model

    prompt = side.prompt_ids(1)[0]
    files = sorted(resolve_model(config.model).path.glob("*.safetensors"))
    found, skipped = {}, _theirs_do_not_fit(config)
    for which in ("ours",) if skipped else ("ours", "theirs"):
        read_through(files)  # both sides from the page cache (where it holds the files)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            try:
                found[which] = pool.submit(_child_load, which, config, prompt).result()
            except BrokenProcessPool as exc:
                raise RuntimeError(f"bench_load: the child loading {which} side died (out of "
                                   "memory?); the system log says what killed it") from exc
    ours = found["ours"]
    weights = ours["weights_mb"]
    mine = {"weights_mb": weights, "load_s": ours["load_s"],
            "first_token_s": ours["first_token_s"], "resident_after_load_mb": ours["added_mb"],
            "resident_over_weights": round(ours["added_mb"] / weights, 3),
            "peak_load_over_weights": round(ours["peak_added_mb"] / weights, 3),
            "fresh_single_stream_tok_s": ours["tok_s"]}
    if skipped:
        return {**mine, "hf_load_skipped": skipped}
    theirs = found["theirs"]
    return {**mine, "hf_load_s": theirs["load_s"],
            "load_time_ratio": round(ours["load_s"] / theirs["load_s"], 3),
            "hf_first_token_s": theirs["first_token_s"],
            "first_token_time_ratio": round(ours["first_token_s"] / theirs["first_token_s"], 3),
            "hf_resident_over_weights": round(theirs["added_mb"] / theirs["weights_mb"], 3),
            "hf_fresh_single_stream_tok_s": theirs["tok_s"]}


def _theirs_do_not_fit(config: BenchConfig) -> str | None:
    """Why transformers' copy of the model in its dtype cannot load here (None: it can): its
    weights' bytes and a tenth beside above the memory available now."""
    import psutil
    from transformers import AutoConfig

    from workbench.models import resolve_dtype
    from workbench.models.registry import resolve_model

    dtype = resolve_dtype(float_dtype(config.dtype))
    need = weights_bytes(AutoConfig.from_pretrained(resolve_model(config.model).path), dtype)
    free = psutil.virtual_memory().available
    if 1.1 * need <= free:
        return None
    return (f"transformers' {str(dtype).removeprefix('torch.')} copy: {need / 1e9:.1f} GB of "
            f"weights, {free / 1e9:.1f} GB available")


def read_through(files: list[Path]) -> None:
    """Reads `files` once (into the OS's page cache, as a second load finds them), so that
    neither side of `bench_load` pays for reading the disk the other did not."""
    for file in files:
        with open(file, "rb", buffering=0) as handle:
            while handle.read(64 * 2**20):
                pass


def _child_load(which: str, config: BenchConfig, prompt: list[int]) -> dict[str, float]:
    """What a child of `bench_load` runs: one side loaded and streaming, and its figures."""
    import torch  # deferred: torch is heavy; `workbench bench --help` stays light
    import transformers  # noqa: F401  (imported before the clock starts, on both sides)

    from workbench import LLM
    from workbench.models import load_model, memory

    torch.set_num_threads(config.threads)
    before = memory.resident()
    start = time.perf_counter()
    if which == "ours":
        llm = LLM(model=config.model, dtype=config.dtype, kernel=config.kernel, seed=config.seed,
                  **engine_extras(config))
        loaded = llm.llm_engine.loaded

        def run(tokens: int) -> int:  # the prompt computed every time, as transformers does
            llm.llm_engine.reset_prefix_cache()
            return ours_generate(llm, [prompt], tokens, sample=False)
    else:
        loaded = load_model(config.model, dtype=float_dtype(config.dtype), progress=False)
        run = lambda tokens: hf_generate(loaded, [prompt], tokens, sample=False)
    load_s = time.perf_counter() - start
    after = memory.resident()
    run(1)  # the first token: transformers reads its mapped weights only now
    first_token_s = time.perf_counter() - start
    run(4)  # warm-up
    rate = tokens_per_second(lambda: run(config.tokens))
    weights = weights_bytes(loaded.config, kept_dtype(loaded), loaded.quantized) / 2**20
    added = peak = float("nan")
    if before is not None and after is not None:
        added, peak = after.rss - before.rss, after.peak - before.rss
    return {"load_s": round(load_s, 2), "first_token_s": round(first_token_s, 2),
            "weights_mb": round(weights, 1),
            "added_mb": round(added, 1), "peak_added_mb": round(peak, 1), "tok_s": round(rate, 2)}


def weights_bytes(config, dtype, quantized: dict | None = None) -> int:
    """The bytes of a checkpoint's weights of `config` in `dtype` (a tied weight once), where
    `quantized` has a weight's GGUF blocks, those: the model built on the meta device."""
    quantized = quantized or {}
    return sum(quantized[name].nbytes if name in quantized else p.numel() * p.element_size()
               for name, p in meta_model(config, dtype).named_parameters())


def kept_dtype(loaded) -> Any:
    """The dtype a loaded model's weights are kept in: bfloat16 where a float32 model keeps its
    checkpoint's (`LoadedModel.weights_dtype`), else its dtype (the bytes a step reads)."""
    return loaded.weights_dtype or loaded.dtype


def meta_model(config, dtype):
    """A model of `config` in `dtype` on the meta device: its weights' names and shapes, no
    memory."""
    import torch  # deferred: torch is heavy; `workbench bench --help` stays light
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def bench_stream_share(side: Contenders, config: BenchConfig) -> dict[str, Any]:
    """Our lone stream's share of the read bandwidth measured at the same moments: `pairs`
    times, a read-bandwidth measure (5 passes) right before a greedy stream of `tokens`
    tokens, both in this process on the engine's thread, each stream's rate over the limit
    that moment's bandwidth sets (`stream_share_of_limit`: the median pair, with the least and
    the most). This VM's read rate moves by up to 2x from one second to the next (31-57 GB/s
    within a minute, 2026-12-06), so a share against a bandwidth read at another moment can
    move as much; each pair's two figures are a second apart."""
    loaded = side.ours.llm_engine.loaded
    if side.ours.llm_engine.runner.kernel.device != "cpu":
        return {}
    step_bytes = decode_step_bytes(meta_model(loaded.config, kept_dtype(loaded)), loaded.quantized)
    prompts = side.prompt_ids(1)
    ours_generate(side.ours, prompts, 4, sample=False)  # warm-up
    shares, reads = [], []
    for _ in range(max(3, config.repeats)):
        read = memory_read_bandwidth(config.threads, passes=5).median
        rate = tokens_per_second(lambda: ours_generate(side.ours, prompts, config.tokens,
                                                       sample=False))
        reads.append(read)
        shares.append(rate / (read * 1e9 / step_bytes))
    return {"stream_share_of_limit": round(statistics.median(shares), 3),
            "stream_share_of_limit_min": round(min(shares), 3),
            "stream_share_of_limit_max": round(max(shares), 3),
            "stream_share_reads_gb_s": [round(r, 1) for r in reads]}


def hf_beam(lm, prompt: list[int], width: int, tokens: int) -> int:
    """transformers' beam search, `num_beams=width`, exactly `tokens` new tokens."""
    import torch  # deferred: torch is heavy; `workbench bench --help` stays light

    ids = torch.tensor([prompt], device=lm.device)
    with torch.inference_mode():
        out = lm.model.generate(ids, num_beams=width, num_return_sequences=width, do_sample=False,
                                max_new_tokens=tokens, min_new_tokens=tokens, early_stopping=False,
                                pad_token_id=lm.tokenizer.pad_token_id)  # [W, T + tokens]
    return (out.shape[1] - ids.shape[1]) * out.shape[0]


def ours_beam(llm, prompt: list[int], width: int, tokens: int) -> int:
    """Our engine's beam search (beams share the prompt's KV blocks), exactly `tokens` steps."""
    out = llm.beam_search({"prompt_token_ids": prompt},
                          BeamSearchParams(beam_width=width, max_tokens=tokens, ignore_eos=True))[0]
    return sum(len(s.tokens) - len(prompt) for s in out.sequences)


def seconds(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def bench_beam4(side: Contenders, config: BenchConfig) -> dict[str, float]:
    """Beam search, width 4, `tokens` tokens: seconds per search, ours over theirs."""
    prompt = side.prompt_ids(1)[0]
    ours = lambda tokens: ours_beam(side.ours, prompt, 4, tokens)
    theirs = lambda tokens: hf_beam(side.theirs, prompt, 4, tokens)
    ours(4), theirs(4)  # warm-up
    ours_s = theirs_s = float("inf")
    for _ in range(config.repeats):
        ours_s = min(ours_s, seconds(lambda: ours(config.tokens)))
        theirs_s = min(theirs_s, seconds(lambda: theirs(config.tokens)))
    return {"beam4_s": round(ours_s, 3), "hf_beam4_s": round(theirs_s, 3),
            "beam4_time_ratio": round(ours_s / theirs_s, 3)}


def bench_hf_static(side: Contenders, config: BenchConfig) -> dict[str, Any]:
    """transformers at its fastest single stream: `generate` with its static KV cache and its
    decode step `torch.compile`d (`cache_implementation="static"`; transformers compiles that
    step itself, with `CompileConfig(fullgraph=True)`, on a GPU; `hf_static_compiled` says
    whether it did), in turn with our single stream (`single_stream_static_ratio`: ours over
    it). Its first call compiles (`hf_static_first_call_s`); each side is warmed up at full
    length, since the static cache's shape is the length and another would compile again."""
    from transformers import CompileConfig  # deferred: transformers is heavy to import

    prompts = side.prompt_ids(1)
    static = dict(cache_implementation="static", compile_config=CompileConfig(fullgraph=True))
    ours = lambda: ours_generate(side.ours, prompts, config.tokens, sample=False)
    theirs = lambda: hf_generate(side.theirs, prompts, config.tokens, sample=False, **static)
    first_call_s = seconds(theirs)
    theirs(), ours()  # warm-up: after the compile, CUDA graphs are recorded on a later call
    ours_rate = theirs_rate = 0.0
    for _ in range(config.repeats):
        ours_rate = max(ours_rate, tokens_per_second(ours))
        theirs_rate = max(theirs_rate, tokens_per_second(theirs))
    compiled = getattr(side.theirs.model, "_compiled_call", None) is not None
    return {"hf_static_single_stream_tok_s": round(theirs_rate, 2),
            "single_stream_static_ratio": round(ours_rate / theirs_rate, 3),
            "hf_static_first_call_s": round(first_call_s, 2), "hf_static_compiled": compiled}


@dataclass(frozen=True)
class ReadBandwidth:
    """A memory read bandwidth in GB/s: the median of several timed passes, and their quartiles."""

    median: float
    q1: float
    q3: float


def memory_read_bandwidth(threads: int, megabytes: int = 512, passes: int = 15) -> ReadBandwidth:
    """This machine's memory read bandwidth on `threads` torch threads: a float32 sum over
    `megabytes` (16 times a 32 MB L3), every page written before timing and one pass untimed,
    then `passes` timed passes (~0.5 s in all at 20 GB/s). Called on the thread that runs the
    engine's steps, in its process (`bench_machine`): the same OpenMP team, the same memory
    placement as the stream it bounds."""
    import torch  # deferred: torch is heavy; `workbench bench --help` stays light

    if passes < 2:
        raise ValueError(f"passes must be at least 2 (a median and quartiles), got {passes}")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        buffer = torch.ones(megabytes * 2**20 // 4)  # ones, not empty: the writes map every page
        buffer.sum()  # untimed: the first pass over fresh pages runs slow
        rates = [buffer.numel() * 4 / seconds(buffer.sum) / 1e9 for _ in range(passes)]
    finally:
        torch.set_num_threads(previous)
    q1, median, q3 = statistics.quantiles(rates, n=4, method="inclusive")
    return ReadBandwidth(median=median, q1=q1, q3=q3)


def bench_engine_memory(side: Contenders, config: BenchConfig) -> dict[str, float]:
    """The peak RSS of our engine alone (`engine_peak_rss_mb`): in a spawned child (a fresh
    interpreter, as a server's process starts), `LLM(model, dtype, kernel)` loaded, then a
    lone stream and `concurrency` streams of `tokens` tokens. `peak_rss_mb` is the bench
    process's, which also holds transformers' copy (float32 with `--dtype gguf`) and, for the
    batch-invariance figures, a second engine."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    prompts = side.prompt_ids(config.concurrency)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        peak = pool.submit(_child_engine_peak, config, prompts).result()
    return {"engine_peak_rss_mb": peak}


def _child_engine_peak(config: BenchConfig, prompts: list[list[int]]) -> float:
    """What the child runs: the engine loaded and generating, then this process's peak RSS."""
    import torch  # deferred: torch is heavy; `workbench bench --help` stays light

    from workbench import LLM

    torch.set_num_threads(config.threads)
    llm = LLM(model=config.model, dtype=config.dtype, kernel=config.kernel, seed=config.seed,
              **engine_extras(config))
    for batch in (prompts[:1], prompts):
        made = ours_generate(llm, batch, config.tokens, sample=False)
        if made != len(batch) * config.tokens:
            raise RuntimeError(f"the engine made {made} tokens, not {len(batch) * config.tokens}")
    return own_peak_rss_mb()


def own_peak_rss_mb() -> float:
    """This process's peak resident memory since it began running its program, in MB: Linux's
    `VmHWM`. (`ru_maxrss` keeps the high-water mark of the process before its `exec`: a
    spawned child, forked from the bench and then exec'd, would report the bench's own peak.)
    Elsewhere `peak_rss_mb()`."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    return peak_rss_mb()


def engine_extras(config: BenchConfig) -> dict[str, Any]:
    """Our engine's settings beyond model, dtype, kernel and seed: `gguf_activations` where
    it is not the default."""
    return {"gguf_activations": config.gguf_activations} \
        if config.gguf_activations != "float32" else {}


def float_dtype(dtype: str, gguf_side: str = "float32") -> str:
    """The dtype a side that keeps no GGUF blocks loads in: `gguf_side` for `--dtype gguf`."""
    return gguf_side if dtype == "gguf" else dtype


def decode_step_bytes(model, quantized: dict | None = None) -> int:
    """Bytes of weights one decode step reads: every parameter once, except the input
    embedding (one row a token), plus the LM head whole (a tied one is the embedding's
    tensor); where `quantized` has a weight's GGUF blocks (the LM head's among them), those."""
    quantized = quantized or {}
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    total = 0
    for name, p in model.named_parameters():  # a tied weight once, by its first name
        if p is not embed:
            total += quantized[name].nbytes if name in quantized else p.numel() * p.element_size()
    if head is not None and head.weight is embed:
        blocks = quantized.get("lm_head.weight")
        total += blocks.nbytes if blocks is not None else embed.numel() * embed.element_size()
    return total


def bench_machine(side: Contenders, config: BenchConfig) -> dict[str, Any]:
    """What the run measures on: CPU flags, dtype, kernel, and the single-stream limit."""
    runner = side.ours.llm_engine.runner
    choice = runner.kernel
    figures = {"device": choice.device, "cpu_flags": choice.cpu_flags,
               "dtype": "gguf" if choice.kernel in ("gguf", "gguf_q8") else str(
                   choice.dtype).removeprefix("torch."), "kernel": choice.kernel,
               "ops": choice.ops}
    if figures["dtype"] == "gguf":  # the activations its blocks meet ("q8": llama.cpp's)
        figures["gguf_activations"] = config.gguf_activations
    if choice.device != "cpu":  # the limit below is the CPU's memory
        return figures
    read = memory_read_bandwidth(config.threads)  # here: the stream's process and threads
    loaded = side.ours.llm_engine.loaded
    # the weights as the checkpoint holds them (ours are fused, the same bytes), or the blocks
    # ours reads instead
    model = meta_model(loaded.config, kept_dtype(loaded))
    limit = read.median * 1e9 / decode_step_bytes(model, loaded.quantized)
    return {**figures, "memory_read_gb_s": round(read.median, 2),
            "memory_read_gb_s_q1": round(read.q1, 2), "memory_read_gb_s_q3": round(read.q3, 2),
            "single_stream_limit_tok_s": round(limit, 2)}


def bench_embed(side: Contenders, config: BenchConfig) -> dict[str, float]:
    """Sentences per second embedding a mixed-length corpus: our encode path vs transformers'
    padded batches of 32, same pooling and dtype (`workbench/apps/bench_embed.py`)."""
    return embed.bench_embed(side.embed, embed.corpus(config.embed_sentences, config.seed),
                             max(config.repeats, 3))  # short runs: at least 3 turns each


INSIDE_RUN_S = 1.0  # the seconds of one run (a quick bench's: a third)
INSIDE_MAX_TOKENS = 512


def bench_inside(side: Contenders, config: BenchConfig) -> dict[str, float]:
    """A lone greedy stream as it is (runs of about `INSIDE_RUN_S` each), capturing one layer's
    `hook_resid_post` at every position, and steered (one vector added at that layer): each against the plain stream in
    turn (`inside_*_ratio` = its rate / the plain rate); with 5 logprobs a token
    (`logprobs5_ratio`, against the plain stream) and with `token_stats` beside them
    (`token_stats_ratio`, against the 5 logprobs alone). Every run starts with the prefix cache
    reset: a capture computes every position of its prompt, and a cached prompt would credit
    the plain stream with a prefill it skipped."""
    llm, prompt = side.ours, side.prompt_ids(1)[0]
    layer = llm.llm_engine.model.config.num_hidden_layers // 2
    width = llm.llm_engine.model.config.hidden_size
    extras = {"plain": {},
              "capture": {"capture": {"sites": ["resid_post"], "layers": [layer]}},
              "steer": {"interventions": [{"site": "resid_post", "layer": layer, "op": "add",
                                           "vector": [0.01] * width}]},
              "logprobs": {"logprobs": 5},
              "token_stats": {"logprobs": 5, "token_stats": True}}

    def run(extra: dict[str, Any], tokens: int) -> int:
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0, **extra)
        llm.llm_engine.reset_prefix_cache()
        return len(llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids)

    best = dict.fromkeys(extras, 0.0)
    for extra in extras.values():
        run(extra, 4)  # warm-up
    # runs of about a second each (a fast model's 64 tokens take a quarter of one, and a
    # burst of load from elsewhere then moves a ratio by 10 %)
    seconds = INSIDE_RUN_S if config.repeats > 1 else INSIDE_RUN_S / 3
    rate = tokens_per_second(functools.partial(run, {}, config.tokens))
    tokens = min(INSIDE_MAX_TOKENS, max(config.tokens, int(rate * seconds)))
    for _ in range(config.repeats):
        for name, extra in extras.items():
            rate = tokens_per_second(functools.partial(run, extra, tokens))
            best[name] = max(best[name], rate)
    return {"inside_plain_tok_s": round(best["plain"], 2),
            "inside_capture_ratio": round(best["capture"] / best["plain"], 3),
            "inside_steer_ratio": round(best["steer"] / best["plain"], 3),
            "logprobs5_ratio": round(best["logprobs"] / best["plain"], 3),
            "token_stats_ratio": round(best["token_stats"] / best["logprobs"], 3)}


def bench_invariant(side: Contenders, config: BenchConfig) -> dict[str, float]:
    """What `batch_invariant=True` costs: a lone greedy stream, `concurrency` streams at once,
    and a long prompt's prefill (a 512-token prompt, one token out), each on a second engine
    with it against ours without it, in turn (`invariant_*_ratio` = its rate / the plain one's;
    below 1 is slower)."""
    from workbench import LLM  # deferred: workbench.llm imports torch

    plain = side.ours
    invariant = LLM(model=config.model, dtype=config.dtype, kernel=config.kernel,
                    seed=config.seed, batch_invariant=True, **engine_extras(config))
    single, many = side.prompt_ids(1), side.prompt_ids(config.concurrency)
    long_prompt = [(single[0] * 64)[:512]]

    def run(llm, prompts: list[list[int]], tokens: int) -> int:
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        return sum(len(out.outputs[0].token_ids) for out in outs)

    cases = {"single": (single, config.tokens), "concurrent": (many, config.tokens // 2),
             "prefill": (long_prompt, 1)}
    best = {(name, which): 0.0 for name in cases for which in ("plain", "invariant")}
    for llm in (plain, invariant):
        run(llm, single, 4)  # warm-up
    for _ in range(config.repeats):
        for name, (prompts, tokens) in cases.items():
            for which, llm in (("plain", plain), ("invariant", invariant)):
                llm.llm_engine.reset_prefix_cache()  # the prefill is measured
                start = time.perf_counter()
                run(llm, prompts, tokens)
                rate = (sum(map(len, prompts)) if name == "prefill" else
                        len(prompts) * tokens) / (time.perf_counter() - start)
                best[name, which] = max(best[name, which], rate)
    del invariant
    return {"invariant_single_tok_s": round(best["single", "invariant"], 2),
            **{f"invariant_{name}_ratio": round(best[name, "invariant"] / best[name, "plain"], 3)
               for name in cases}}


FEATURES_D_SAE = 16384  # the bench SAE's features (a 16k SAE, as SAELens's releases)
FEATURES_D_SAE_WIDE = 65536  # at a width of 2048 and more (Gemma-2-2B's): Gemma Scope's 65k
FEATURES_K = 64  # its TopK: a trained SAE's L0, so decoding reads 64 rows a token
FEATURES_TOP_K = 10  # the features a request reads per position


def bench_features(side: Contenders, config: BenchConfig) -> dict[str, float]:
    """What reading an SAE's features costs: a random TopK SAE of `FEATURES_D_SAE` features
    (`FEATURES_D_SAE_WIDE` on a model 2048 wide or wider; k = `FEATURES_K`) at the middle
    layer's `resid_post`, its top `FEATURES_TOP_K` read at every position of `concurrency`
    streams and of a 512-token prompt's prefill, each against the same requests without, in
    turn (`features_concurrent_ratio`, `features_prefill_ratio`: its rate / the plain one's);
    then Neuronpedia's routes with it (`neuronpedia_speedups`)."""
    import tempfile

    import torch

    from workbench.features.sae import save_sae

    llm = side.ours
    cfg = llm.llm_engine.model.config
    gen = torch.Generator().manual_seed(config.seed)
    width, layer = cfg.hidden_size, cfg.num_hidden_layers // 2
    d_sae = FEATURES_D_SAE_WIDE if width >= 2048 else FEATURES_D_SAE
    weights = {"W_enc": torch.randn(width, d_sae, generator=gen) / width ** 0.5,
               "b_enc": torch.zeros(d_sae),
               "W_dec": torch.randn(d_sae, width, generator=gen) / d_sae ** 0.5,
               "b_dec": torch.zeros(width)}
    with tempfile.TemporaryDirectory() as folder:
        llm.load_sae("bench", save_sae(folder, weights, f"blocks.{layer}.hook_resid_post",
                                       "topk", k=FEATURES_K))
    many = side.prompt_ids(config.concurrency)
    long_prompt = [(side.prompt_ids(1)[0] * 64)[:512]]
    read = {"sae": "bench", "top_k": FEATURES_TOP_K}

    def run(prompts: list[list[int]], tokens: int, features: Any) -> None:
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, temperature=0.0,
                                features=features)
        llm.generate([{"prompt_token_ids": p} for p in prompts], params)

    cases = {"concurrent": (many, config.tokens // 2), "prefill": (long_prompt, 1)}
    best = {(name, which): 0.0 for name in cases for which in ("plain", "features")}
    run(many[:1], 4, read)  # warm-up
    try:
        for _ in range(config.repeats):
            for name, (prompts, tokens) in cases.items():
                for which, features in (("plain", None), ("features", read)):
                    llm.llm_engine.reset_prefix_cache()  # the prefill is measured
                    start = time.perf_counter()
                    run(prompts, tokens, features)
                    rate = (512 if name == "prefill" else len(prompts) * tokens) / (
                        time.perf_counter() - start)
                    best[name, which] = max(best[name, which], rate)
        speedups = neuronpedia_speedups(llm, side.prompt_ids(1)[0] * 8, config.repeats)
    finally:
        llm.unload_sae("bench")
    return {"features_d_sae": d_sae,
            **{f"features_{name}_ratio": round(best[name, "features"] / best[name, "plain"], 3)
               for name in cases}, **speedups}


NEURONPEDIA_CLIENTS = 8  # concurrent clients of Neuronpedia's routes


def neuronpedia_speedups(llm: Any, prompt: list[int], repeats: int) -> dict[str, float]:
    """Neuronpedia's routes over HTTP with the SAE "bench" loaded: `NEURONPEDIA_CLIENTS`
    clients at once against the same requests one at a time (`neuronpedia_topk_speedup`: each
    a prompt's top features per token; `neuronpedia_steer_speedup`: each a steered and a
    default completion of 16 tokens): the time one at a time / the time together, above 1 is
    the engine batching the clients' requests."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from workbench import serve_in_kernel
    from workbench.engine.model_thread import while_serving

    text = llm.get_tokenizer().decode(prompt[:64])
    model = llm.llm_engine.served_model_name
    bodies = {
        "topk": ("activation/topk-by-token", {"prompt": text, "model": model, "source": "bench",
                                              "top_k": FEATURES_TOP_K, "ignore_bos": False}),
        "steer": ("steer/completion", {
            "prompt": text, "model": model, "steer_method": "SIMPLE_ADDITIVE",
            "normalize_steering": False, "types": ["STEERED", "DEFAULT"],
            "features": [{"model": model, "source": "bench", "index": 1, "strength": 4.0}],
            "n_completion_tokens": 16, "temperature": 0, "strength_multiplier": 1,
            "freq_penalty": 0, "seed": 0})}

    def measure() -> dict[str, float]:
        handle = serve_in_kernel(llm, port=0)
        try:
            with httpx.Client(base_url=handle.base_url, timeout=600) as client:
                def call(request: tuple[str, dict[str, Any]]) -> None:
                    client.post("/" + request[0], json=request[1]).raise_for_status()

                out = {}
                with ThreadPoolExecutor(NEURONPEDIA_CLIENTS) as pool:
                    for name, request in bodies.items():
                        call(request)  # warm-up
                        alone = together = math.inf
                        for _ in range(repeats):
                            start = time.perf_counter()
                            for _ in range(NEURONPEDIA_CLIENTS):
                                call(request)
                            alone = min(alone, time.perf_counter() - start)
                            start = time.perf_counter()
                            list(pool.map(call, [request] * NEURONPEDIA_CLIENTS))
                            together = min(together, time.perf_counter() - start)
                        out[f"neuronpedia_{name}_speedup"] = round(alone / together, 3)
                return out
        finally:
            handle.stop(timeout=5)

    return while_serving(measure)  # the model thread steps the server's requests meanwhile


def capture_corpus(count: int = 48, seed: int = 0) -> list[str]:
    """`count` documents of 20 to 120 words (seeded): a capture job's bench corpus."""
    import random

    words = ("the model reads every token of a document and writes what each layer holds "
             "into shards on disk so that a probe or an autoencoder can train on them later "
             "while the engine batches documents of many lengths").split()
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(20, 120))).capitalize() + "."
            for _ in range(count)]


def bench_capture(side: Contenders, config: BenchConfig) -> dict[str, Any]:
    """A capture job (one middle layer's `resid_post` at every token) with the jobs' default
    arithmetic (a batch-invariant engine; its requests stop after that layer: `stop_at_layer`)
    against our plain engine's prefill of the whole model on the same documents
    (`capture_prefill_ratio`, above 1 is faster), the bytes it writes per second,
    and, where Ray is installed, the same job on two Ray replicas of one CPU each against the
    local job (`capture_ray2_ratio`: wall-clock after `ray.init`, the replicas' start-up and
    model loads included; `capture_ray2_steady_ratio`: the rate after each job's first shard,
    start-up aside; `capture_ray2_first_shard_s`: the Ray job's seconds until its first shard,
    the start-up's cost; `capture_ray2_compute_ratio`: the shards' own compute time)."""
    import shutil
    import tempfile

    from workbench import LLM  # deferred: workbench.llm imports torch
    from workbench.jobs import CaptureJob

    docs = capture_corpus(16 if config.repeats == 1 else 48)
    plain = side.ours
    ids = [plain.get_tokenizer()(text)["input_ids"] for text in docs]
    tokens = sum(map(len, ids))
    invariant = LLM(model=config.model, dtype=config.dtype, kernel=config.kernel,
                    seed=config.seed, batch_invariant=True, **engine_extras(config))
    layer = invariant.llm_engine.loaded.config.num_hidden_layers // 2
    spec = {"sites": ["resid_post"], "layers": [layer]}
    once = SamplingParams(max_tokens=1, temperature=0.0)
    best = {"plain": 0.0, "capture": 0.0}
    written = 0
    for _ in range(config.repeats):
        plain.llm_engine.reset_prefix_cache()
        start = time.perf_counter()
        plain.generate([{"prompt_token_ids": p} for p in ids], once)
        best["plain"] = max(best["plain"], tokens / (time.perf_counter() - start))
        out = tempfile.mkdtemp()
        try:
            invariant.llm_engine.reset_prefix_cache()
            summary = CaptureJob(config.model, docs, spec, out, llm=invariant,
                                 docs_per_shard=16, progress=False).run()
            best["capture"] = max(best["capture"], summary["tokens"] / summary["seconds"])
            written = sum(f.stat().st_size for f in Path(out, "shards").iterdir())
        finally:
            shutil.rmtree(out, ignore_errors=True)
    # against Ray: the same job (shards of 4 documents, so that the rate after the first shard
    # is measured over several) here and on the replicas
    out = tempfile.mkdtemp()
    try:
        invariant.llm_engine.reset_prefix_cache()
        local = CaptureJob(config.model, docs, spec, out, llm=invariant, docs_per_shard=4,
                           progress=False).run()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    del invariant
    found: dict[str, Any] = {
        "capture_job_tok_s": round(best["capture"], 1),
        "capture_plain_prefill_tok_s": round(best["plain"], 1),
        "capture_prefill_ratio": round(best["capture"] / best["plain"], 3),
        "capture_mb_per_s": round(written / 2**20 * best["capture"] / tokens, 2)}
    try:
        from workbench.jobs.ray_pool import connect, require_ray
        started = not require_ray().is_initialized()  # a Ray of our own: shut down after
        ray = connect(num_cpus=2)
    except ImportError:
        return found  # no Ray: the local figures alone
    out = tempfile.mkdtemp()
    try:
        summary = CaptureJob(config.model, docs, spec, out, dtype=config.dtype,
                             kernel=config.kernel, docs_per_shard=4, ray=True, replicas=2,
                             engine_kwargs=engine_extras(config), progress=False).run()
        compute = sum(json.loads(f.read_text())["seconds"]
                      for f in Path(out, "shards").glob("*.json"))
        found["capture_ray2_ratio"] = round(local["seconds"] / summary["seconds"], 3)
        found["capture_ray2_steady_ratio"] = round(
            summary["steady_tokens_per_s"] / local["steady_tokens_per_s"], 3)
        found["capture_ray2_first_shard_s"] = summary["first_shard_s"]
        found["capture_ray2_compute_ratio"] = round(local["seconds"] / (compute / 2), 3)
    finally:
        shutil.rmtree(out, ignore_errors=True)
        if started:
            ray.shutdown()
    return found


DASHBOARD_D_SAE, DASHBOARD_K = 4608, 32  # the dashboards job's SAE: what `train-sae` makes


def bench_dashboards(side: Contenders, config: BenchConfig) -> dict[str, Any]:
    """A feature-dashboards job (a random TopK SAE of `DASHBOARD_D_SAE` features at the middle
    layer's `resid_post`) against a capture job of the same site on the same documents, both on
    one batch-invariant engine, in turn (`dashboards_capture_ratio`: its tokens/s / the capture
    job's, above 1 is faster; `dashboards_steady_ratio`: the same after each job's first shard,
    whose dashboards also hold the one-off logit table of every feature, a few seconds against
    the bench's few thousand tokens; `dashboards_merge_s`: the merge into Parquet)."""
    import shutil
    import tempfile

    import torch

    from workbench import LLM  # deferred: workbench.llm imports torch
    from workbench.features.sae import save_sae
    from workbench.jobs import CaptureJob
    from workbench.jobs.dashboards import DashboardJob

    docs = capture_corpus(16 if config.repeats == 1 else 48)
    llm = LLM(model=config.model, dtype=config.dtype, kernel=config.kernel, seed=config.seed,
              batch_invariant=True, **engine_extras(config))
    cfg = llm.llm_engine.loaded.config
    width, layer = cfg.hidden_size, cfg.num_hidden_layers // 2
    gen = torch.Generator().manual_seed(config.seed)
    folder = tempfile.mkdtemp()
    save_sae(folder, {"W_enc": torch.randn(width, DASHBOARD_D_SAE, generator=gen) / width ** 0.5,
                      "b_enc": torch.zeros(DASHBOARD_D_SAE),
                      "W_dec": torch.randn(DASHBOARD_D_SAE, width, generator=gen) /
                      DASHBOARD_D_SAE ** 0.5, "b_dec": torch.zeros(width)},
             f"blocks.{layer}.hook_resid_post", "topk", k=DASHBOARD_K)
    best = {"capture": 0.0, "dashboards": 0.0}
    steady = {"capture": 0.0, "dashboards": 0.0}  # after shard 0 (which holds the logit table)
    merge = math.inf
    try:
        for _ in range(config.repeats):
            for which in best:
                out = tempfile.mkdtemp()
                try:
                    llm.llm_engine.reset_prefix_cache()
                    if which == "capture":
                        summary = CaptureJob(config.model, docs, {
                            "sites": ["resid_post"], "layers": [layer]}, out, llm=llm,
                            docs_per_shard=16, progress=False).run()
                    else:
                        summary = DashboardJob(config.model, docs, folder, out, llm=llm,
                                               docs_per_shard=16, progress=False).run()
                        merge = min(merge, summary["merge_seconds"])
                    best[which] = max(best[which], summary["tokens"] / summary["seconds"])
                    steady[which] = max(steady[which], summary["steady_tokens_per_s"] or 0.0)
                finally:
                    shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    found = {"dashboards_tok_s": round(best["dashboards"], 1),
             "dashboards_capture_ratio": round(best["dashboards"] / best["capture"], 3),
             "dashboards_merge_s": merge}
    if steady["capture"] and steady["dashboards"]:  # more than one shard each
        found["dashboards_steady_ratio"] = round(steady["dashboards"] / steady["capture"], 3)
    return found


def bench_gguf_activations(side: Contenders, config: BenchConfig) -> dict[str, float]:
    """With `--dtype gguf` only: both arithmetics of the file's blocks in one run, ours (its
    `--gguf-activations`) and a second engine with the other, in turn: a lone greedy stream
    (`gguf_<mode>_single_stream_tok_s`, prefill of the story prompt included) and a 512-token
    prompt's prefill, one token out (`gguf_<mode>_prefill512_tok_s`, the prefix cache reset),
    and `gguf_q8_speedup` (q8's single stream over float32's)."""
    if config.dtype != "gguf":
        return {}
    from workbench import LLM  # deferred: workbench.llm imports torch

    other = "q8" if config.gguf_activations == "float32" else "float32"
    engines = {config.gguf_activations: side.ours,
               other: LLM(model=config.model, dtype="gguf", seed=config.seed,
                          gguf_activations=other)}
    single = side.prompt_ids(1)
    long_prompt = [(single[0] * 64)[:512]]
    best = {(mode, case): 0.0 for mode in engines for case in ("single_stream", "prefill512")}
    for llm in engines.values():
        ours_generate(llm, single, 4, sample=False)  # warm-up
    for _ in range(config.repeats):
        for mode, llm in engines.items():
            best[mode, "single_stream"] = max(best[mode, "single_stream"], tokens_per_second(
                lambda llm=llm: ours_generate(llm, single, config.tokens, sample=False)))
            llm.llm_engine.reset_prefix_cache()  # the prefill is measured
            start = time.perf_counter()
            ours_generate(llm, long_prompt, 1, sample=False)
            best[mode, "prefill512"] = max(best[mode, "prefill512"],
                                           512 / (time.perf_counter() - start))
    del engines[other]
    out = {f"gguf_{mode}_{case}_tok_s": round(rate, 2) for (mode, case), rate in best.items()}
    out["gguf_q8_speedup"] = round(best["q8", "single_stream"] / best["float32", "single_stream"],
                                   3)
    return out


BENCHMARKS: tuple[Callable[[Contenders, BenchConfig], dict[str, Any]], ...] = (
    bench_load, bench_machine, bench_single_stream, bench_stream_share, bench_gguf_activations,
    bench_concurrent16, bench_prefill512, bench_beam4, bench_embed, bench_inside, bench_invariant,
    bench_capture, bench_features, bench_dashboards, bench_engine_memory)
# the benchmarks that hold transformers' copy beside ours in this process
BOTH_IN_PROCESS = frozenset({bench_single_stream, bench_concurrent16, bench_prefill512,
                             bench_beam4, bench_gguf_activations, bench_invariant, bench_capture})
# what `--shape` runs by default: the serving figures at size (`--only` to choose)
SHAPE_BENCHMARKS = ("load", "machine", "single_stream", "stream_share", "concurrent16",
                    "prefill512", "inside")


def peak_rss_mb() -> float:
    """The peak resident memory of this process so far, in MB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def format_table(results: dict[str, Any]) -> str:
    """The figures as an aligned two-column table."""
    width = max(map(len, results))
    return "\n".join(f"{key:<{width}}  {value:>10}" for key, value in results.items())


def run(config: BenchConfig, benchmarks=None, log=None, side: Contenders | None = None,
        figures=None) -> dict[str, Any]:
    """Run `benchmarks` (default `BENCHMARKS`) in order; every figure plus `peak_rss_mb`.
    Both sides run on the model thread (`engine/model_thread.py`), as our engine's steps do
    anyway: a second thread running torch would own a second OpenMP team and slow both sides.
    `side`: the contenders (default: `config.model` loaded on both sides); `figures(dict)` is
    called with each benchmark's figures as soon as it has them."""
    from workbench.engine.model_thread import on_model_thread  # deferred: imports torch

    return on_model_thread(_run, config, benchmarks, log, side, figures)


def _run(config: BenchConfig, benchmarks, log, side, figures) -> dict[str, Any]:
    import torch

    torch.set_num_threads(config.threads)
    side, results = side or Contenders(config), {}
    for benchmark in BENCHMARKS if benchmarks is None else benchmarks:
        crowded = benchmark in BOTH_IN_PROCESS and side.both_do_not_fit()
        if crowded:  # said in the figures, never silently left out
            results.setdefault("skipped", {})[benchmark.__name__] = crowded
            continue
        if log:
            log(f"running {benchmark.__name__} ...")
        found = benchmark(side, config)
        results.update(found)
        if figures:
            figures(found)
    if "single_stream_tok_s" in results and "single_stream_limit_tok_s" in results:
        results["single_stream_of_limit"] = round(
            results["single_stream_tok_s"] / results["single_stream_limit_tok_s"], 3)
    results["peak_rss_mb"] = peak_rss_mb()
    return results


def main(argv: list[str] | None = None) -> int:
    """`workbench bench [--json] [--quick]`: print the figures (a table, or one JSON line)."""
    parser = argparse.ArgumentParser(prog="workbench bench", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object, last line")
    parser.add_argument("--quick", action="store_true", help="fewer tokens and repeats")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="auto", help="default: what dtype='auto' picks here")
    parser.add_argument("--kernel", default="auto", help="default: the kernel chosen for the dtype")
    parser.add_argument("--gguf-activations", default="float32", choices=["float32", "q8"],
                        help="with --dtype gguf: the activations the blocks meet (q8: llama.cpp's "
                        "int8 arithmetic); the other one is measured beside it")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--shape", choices=list(SHAPES), help="instead of --model: random weights "
                        "in a real model's layer shapes (the alias random-SHAPE, built once); "
                        f"runs {', '.join(SHAPE_BENCHMARKS)} unless --only says")
    parser.add_argument("--only", help="the benchmarks to run, by name, comma-separated "
                        f"(of {', '.join(b.__name__.removeprefix('bench_') for b in BENCHMARKS)})")
    parser.add_argument("--soak", action="store_true", help="instead: the soak and fuzz run "
                        "(workbench/apps/soak.py): disconnect storms, invalid bodies, schemathesis")
    args = parser.parse_args(argv)
    if args.soak:
        return soak.main(json_line=args.json, quick=args.quick)
    model = shapes.alias(args.shape) if args.shape else args.model
    settings = dict(model=model, dtype=args.dtype, kernel=args.kernel, threads=args.threads,
                    gguf_activations=args.gguf_activations)
    config = BenchConfig.quick(**settings) if args.quick else BenchConfig(**settings)
    names = args.only.split(",") if args.only else SHAPE_BENCHMARKS if args.shape else None
    by_name = {b.__name__.removeprefix("bench_"): b for b in BENCHMARKS}
    unknown = [n for n in names or () if n not in by_name]
    if unknown:
        parser.error(f"--only: no benchmark named {', '.join(unknown)} (of {', '.join(by_name)})")
    benchmarks = [by_name[n] for n in names] if names else None
    results = run(config, benchmarks, log=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(results) if args.json else format_table(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
