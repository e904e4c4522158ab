"""Helpers shared by the engine tests (imported as `tests.engine.helpers`).

`make_llm` builds an `LLM` with a small, explicit KV cache (the default of 1 GB would cost
seconds per engine). `hf_greedy` is the reference: transformers' own
`generate(do_sample=False)` on the same weights, one unpadded prompt at a time;
`reference_pool` and `rank` are beam search written from the algorithm's description over
transformers' forward. Both run on the model's device. `make_request` / `make_seq` build
scheduler inputs from plain token lists, without a model. `GPU_TEST_DEVICE` is where the
tests marked `gpu` put their models.
"""

from __future__ import annotations

import os

import pytest
import torch

from workbench.engine.kernels import c_products
from workbench.engine.requests.request import Request, Sequence
from workbench.llm import LLM
from workbench.models.cpu import cpu_features
from workbench.sampling_params import SamplingParams

# "cuda", or "cpu" where `WORKBENCH_GPU_TESTS_ON_CPU=1` (scripts/gpu_check.py's dry run: the GPU
# tests' code paths on a machine without one; tests/conftest.py then skips none of them)
GPU_TEST_DEVICE = "cpu" if os.environ.get("WORKBENCH_GPU_TESTS_ON_CPU") == "1" else "cuda"

# the C kernels (batch invariance among them) run where the CPU has AVX2 and FMA and a C
# compiler built the library
needs_c = pytest.mark.skipif(not (cpu_features().has("avx2", "fma") and c_products.available()),
                             reason="the C kernels need AVX2, FMA and a C compiler")


def make_llm(loaded, **kwargs) -> LLM:
    """An `LLM` on an already loaded model with a small KV cache unless told otherwise."""
    kwargs.setdefault("max_model_len", 256)
    kwargs.setdefault("block_size", 16)
    kwargs.setdefault("num_kv_blocks", 64)
    return LLM(loaded, **kwargs)


def greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kwargs)


def ids_of(loaded, text: str) -> list[int]:
    return loaded.tokenizer(text)["input_ids"]


@torch.inference_mode()
def hf_greedy(loaded, ids: list[int], max_new_tokens: int, **generate_kwargs) -> list[int]:
    """transformers' greedy continuation of `ids` (stops at EOS like the engine)."""
    inp = torch.tensor([ids], device=loaded.model.device)
    out = loaded.model.generate(
        input_ids=inp, attention_mask=torch.ones_like(inp), do_sample=False,
        max_new_tokens=max_new_tokens, num_beams=1, pad_token_id=loaded.tokenizer.pad_token_id,
        **generate_kwargs)
    return out[0, len(ids):].tolist()


@torch.inference_mode()
def reference_pool(loaded, prompt: list[int], width: int, max_tokens: int, ignore_eos: bool,
                   include_eos: bool = False):
    """Beam search's completed and final live beams: [(tokens, cum_logprob, finish_reason)].

    Every step, one forward pass of the model over all live beams (no cache), top 2W raw
    logprobs each, EOS candidates complete, the best W others go on (vLLM's online beam search).
    """
    model, eos = loaded.model, loaded.tokenizer.eos_token_id
    live = [(list(prompt), 0.0)]
    completed = []
    for _ in range(max_tokens):
        ids = torch.tensor([t for t, _ in live], device=model.device)  # [B, L]: same lengths
        logits = model(input_ids=ids, logits_to_keep=1).logits[:, -1, :model.config.vocab_size]
        top_lp, top_ids = logits.float().log_softmax(-1).topk(2 * width, dim=-1)  # [B, 2W]
        cands = []
        for (tokens, cum), lps, tids in zip(live, top_lp.tolist(), top_ids.tolist()):
            for lp, t in zip(lps, tids):
                if t == eos and not ignore_eos:
                    completed.append((tokens + [t] if include_eos else tokens, cum + lp, "stop"))
                else:
                    cands.append((tokens + [t], cum + lp))
        live = sorted(cands, key=lambda c: -c[1])[:width]
    return completed + [(t, c, "length") for t, c in live]


def rank(pool, width: int, length_penalty: float, eos: int):
    """The best `width` of a `reference_pool` by cum_logprob / length ** length_penalty."""
    def score(item):
        tokens, cum, _ = item
        n = len(tokens) - (1 if tokens[-1] == eos else 0)
        return cum / max(n, 1) ** length_penalty
    return sorted(pool, key=score, reverse=True)[:width]


def alone_and_preempted_mid_prefill(loaded, prompt: list[int], params: SamplingParams):
    """(`prompt`'s final output alone on a roomy cache, its final output on a 16-block cache
    where a growing decoder preempts it in the middle of its prefill, chunked 4 tokens a step,
    and that engine's preemption count)."""
    want = make_llm(loaded, max_model_len=64, block_size=4, num_kv_blocks=256).generate(
        prompt, params)[0]
    engine = make_llm(loaded, max_model_len=64, block_size=4, num_kv_blocks=16,
                      max_num_batched_tokens=5).llm_engine
    engine.add_request("decoder", [5, 6, 7, 8], greedy(50, ignore_eos=True))
    for _ in range(30):  # the decoder holds 9 of the 16 blocks and keeps growing
        engine.step()
    engine.add_request("target", prompt, params)  # prefilled 4 tokens a step, then preempted
    finals = {}
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    return want, finals["target"], engine.stats().num_preemptions


BAD_SEED = 666  # the seed that marks the request an injected fault hits


def faulty_sampler(real):
    """`real` (an engine's sampler), except that a batch holding a `BAD_SEED` row raises."""
    def sampler(logits, rows):
        if any(r.params.seed == BAD_SEED for r in rows):
            raise RuntimeError("injected sampler fault")
        return real(logits, rows)

    return sampler


def make_request(rid: str, tokens: list[int], n: int = 1, priority: int = 0,
                 arrival_time: float = 0.0, max_tokens: int = 16, **params) -> Request:
    """A request with its first sequence, as the engine's `add_request` makes it."""
    sp = SamplingParams(n=n, temperature=1.0 if n > 1 else 0.0, max_tokens=max_tokens, **params)
    req = Request(rid, None, list(tokens), sp, priority=priority, arrival_time=arrival_time)
    req.sequences.append(Sequence(req, 0, tokens, len(tokens)))
    return req


def make_seq(rid: str, tokens: list[int], **kwargs) -> Sequence:
    """The first sequence of a fresh request (see `make_request`)."""
    return make_request(rid, tokens, **kwargs).sequences[0]
