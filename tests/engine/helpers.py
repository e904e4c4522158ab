"""Helpers shared by the engine tests (imported as `tests.engine.helpers`).

`make_llm` builds an `LLM` with a small, explicit KV cache (the default of 1 GB would cost
seconds per engine). `hf_greedy` is the reference: transformers' own
`generate(do_sample=False)` on the same weights, one unpadded prompt at a time.
`make_request` / `make_seq` build scheduler inputs from plain token lists, without a model.
"""

from __future__ import annotations

import torch

from workbench.engine.request import Request, Sequence
from workbench.llm import LLM
from workbench.sampling_params import SamplingParams


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
    inp = torch.tensor([ids])
    out = loaded.model.generate(
        input_ids=inp, attention_mask=torch.ones_like(inp), do_sample=False,
        max_new_tokens=max_new_tokens, num_beams=1, pad_token_id=loaded.tokenizer.pad_token_id,
        **generate_kwargs)
    return out[0, len(ids):].tolist()


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
