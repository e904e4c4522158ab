"""After sampling: appends tokens, records logprobs, detects stops, builds `RequestOutput`s.

Stop rules as vLLM's `check_stop`: nothing stops before `min_tokens`; then EOS (unless
`ignore_eos`, `stop_reason` None), a stop token id (`stop_reason` the id), a stop string found by
the detokenizer (`stop_reason` the string), or length (`max_tokens`, or the end of the context).
A stop token's text is left out of `text` unless `include_stop_str_in_output`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from workbench.engine.requests.detokenizer import IncrementalDetokenizer
from workbench.engine.requests.outputs import CompletionOutput, Logprob, RequestOutput, TokenStats
from workbench.engine.requests.request import Request, Sequence
from workbench.engine.requests.token_stats import token_stats
from workbench.sampling_params import RequestOutputKind


class TokenTexts:
    """Memoized text of single tokens, for `Logprob.decoded_token`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False,
                                         clean_up_tokenization_spaces=False)
            self._cache[token_id] = text
        return text


def position_logprobs(token_id: int, logprob: float, rank: int | None, top_ids: list[int] | None,
                      top_lps: list[float] | None, k: int, texts: TokenTexts,
                      tracked: tuple[list[int], list[float], list[int]] | None = None,
                      ) -> dict[int, Logprob]:
    """{token: Logprob}, the given token first, then the top-k, then the tracked ids
    (`logprob_token_ids`), deduplicated, as vLLM.

    `top_ids` / `top_lps` are None when no row of the batch asked for a top-k (logprobs=0).
    """
    entry = {token_id: Logprob(logprob, rank, texts(token_id))}
    for r, (tid, lp) in enumerate(zip((top_ids or [])[:k], (top_lps or [])[:k]), start=1):
        if tid not in entry:
            entry[tid] = Logprob(lp, r, texts(tid))
    for tid, lp, r in zip(*(tracked or ((), (), ()))):
        if tid not in entry:
            entry[tid] = Logprob(lp, r, texts(tid))
    return entry


def _rows(chunks: list[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """The kept full log-probability rows as one float32 tensor [tokens, V]."""
    if not chunks:
        return torch.empty(0, vocab_size)
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


class OutputProcessor:
    """Per-token bookkeeping of sequences and the outputs handed back to callers."""

    def __init__(self, tokenizer, eos_token_id: int | None, max_model_len: int, vocab_size: int,
                 entropy: Callable[[torch.Tensor], torch.Tensor | None] | None = None):
        """`entropy`: the rows' entropies of logprobs [R, V] (None where it cannot), the
        sampler's own (the engine passes the C pass), so that a prompt position's `token_stats`
        are the bits the same position has when generated; else `token_stats`'s torch sum."""
        self.tokenizer = tokenizer
        self.entropy = entropy
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.texts = TokenTexts(tokenizer)

    def start(self, seq: Sequence) -> None:
        req = seq.request
        context = [] if req.prompt_embeds is not None else req.prompt_token_ids  # no text there
        seq.detok = IncrementalDetokenizer(self.tokenizer, req.params, context)

    def append_token(self, seq: Sequence, token: int, lp: float | None, rank: int | None,
                     top_ids: list[int] | None, top_lps: list[float] | None,
                     tracked: tuple[list[int], list[float], list[int]] | None = None,
                     stats: TokenStats | None = None) -> None:
        """Adds a sampled token, its logprobs (and `token_stats`), and finishes the sequence
        if it should stop."""
        p = seq.request.params
        seq.token_ids.append(token)
        if seq.grammar_matcher is not None:  # structured outputs: the matcher takes the token
            seq.grammar_matcher.accept(token)
        if seq.thinking is not None:  # thinking_token_budget: count reasoning tokens
            seq.thinking.observe(seq.output_token_ids)
        if lp is not None:
            seq.cumulative_logprob += lp
            if seq.logprobs is not None:
                k = p.num_logprobs(self.vocab_size) or 0
                seq.logprobs.append(position_logprobs(token, lp, rank, top_ids, top_lps, k,
                                                      self.texts, tracked))
            if seq.token_stats is not None and stats is not None:
                seq.token_stats.append(stats)
        reason, stop_reason = self._check_stop(seq, token)
        if p.detokenize and (reason != "stop" or p.include_stop_str_in_output):
            # a stop token's text stays out unless asked for; stop strings count after min_tokens
            matched = self._detok(seq).add(token, check_stops=seq.num_output_tokens >= p.min_tokens)
            if matched is not None:
                reason, stop_reason = "stop", matched
        if reason is not None:
            seq.finish_reason, seq.stop_reason = reason, stop_reason

    @staticmethod
    def _detok(seq: Sequence) -> IncrementalDetokenizer:
        assert seq.detok is not None  # `start` gave every sequence its detokenizer
        return seq.detok

    def _check_stop(self, seq: Sequence, token: int) -> tuple[str | None, int | str | None]:
        p = seq.request.params
        matcher = seq.grammar_matcher
        if matcher is not None and matcher.failed:  # no match can follow: not "stop"
            return "length", None
        if seq.num_output_tokens < p.min_tokens:
            return None, None
        if token == self.eos_token_id and not p.ignore_eos:
            return "stop", None
        if token in p._all_stop_token_ids:
            return "stop", token
        assert p.max_tokens is not None  # InputProcessor resolved it
        if seq.num_output_tokens >= p.max_tokens or len(seq.token_ids) >= self.max_model_len:
            return "length", None
        return None, None

    def record_prompt_logprobs(self, req: Request, first_pos: int, logits: torch.Tensor) -> None:
        """logits: [count, V] at prompt positions first_pos.., predicting the next prompt token."""
        if req.prompt_logprobs is None:
            return
        # recomputation after preemption may chunk the prompt differently: keep only new positions
        skip = len(req.prompt_logprobs) - 1 - first_pos
        if skip < 0 or skip >= len(logits):
            return
        logits, first_pos = logits[skip:], first_pos + skip
        k = req.params.num_prompt_logprobs(self.vocab_size)
        assert k is not None  # prompt_logprobs was asked for: `req.prompt_logprobs` exists
        lps = logits[:, :self.vocab_size].log_softmax(-1)  # [count, V]
        targets = torch.tensor(req.prompt_token_ids[first_pos + 1:first_pos + 1 + len(lps)],
                               device=lps.device)
        chosen = lps.gather(1, targets.unsqueeze(1)).squeeze(1)
        ranks = (lps > chosen.unsqueeze(1)).sum(-1) + 1
        top_lp, top_ids = lps.topk(k, -1) if k else (lps[:, :0], lps[:, :0].long())
        for i in range(len(lps)):
            req.prompt_logprobs.append(position_logprobs(
                int(targets[i]), float(chosen[i]), int(ranks[i]), top_ids[i].tolist(),
                top_lp[i].tolist(), k, self.texts))
        if req.prompt_token_stats is not None:
            req.prompt_token_stats += token_stats(lps, ranks, [k] * len(lps), top_lp,
                                                  self.entropy(lps) if self.entropy else None)
        start = req.params.prompt_distributions_from
        if req.prompt_distributions is not None and start is not None:
            # row i predicts prompt token first_pos + 1 + i: keep those from `start` on
            keep = lps[max(0, start - first_pos - 1):]
            if len(keep):
                req.prompt_distributions.append(keep.to(torch.float32, copy=True))

    # -- outputs ----------------------------------------------------------------------------
    def make_output(self, req: Request) -> RequestOutput | None:
        """The request's output for this step, by its `output_kind`; None if nothing new."""
        kind = req.params.output_kind
        finished = req.finished
        if kind is RequestOutputKind.FINAL_ONLY and not finished:
            return None
        if finished and req.metrics.finished_time is None:
            req.metrics.finished_time = time.time()
        delta = kind is RequestOutputKind.DELTA
        outputs = []
        for seq in req.sequences:
            out = self._completion(seq, delta)
            if out is not None:
                outputs.append(out)
        if delta and not outputs and not finished:
            return None
        first = req.sequences[0]
        prompt_lps = req.prompt_logprobs
        if delta and req.prompt_logprobs_sent:
            prompt_lps = None
        if prompt_lps is not None and len(prompt_lps) < first.num_prompt_tokens:
            prompt_lps = None if delta else prompt_lps  # still being computed
        if prompt_lps is not None:
            req.prompt_logprobs_sent = True
        return RequestOutput(
            request_id=req.request_id, prompt=req.prompt,
            prompt_token_ids=None if req.prompt_embeds is not None else req.prompt_token_ids,
            prompt_logprobs=prompt_lps, outputs=outputs, finished=finished,
            num_cached_tokens=req.num_cached_tokens, metrics=req.metrics,
            lora_request=req.lora_request, error=req.error,
            prompt_token_stats=None if prompt_lps is None else req.prompt_token_stats,
            prompt_distributions=None if prompt_lps is None or req.prompt_distributions is None
            else _rows(req.prompt_distributions, self.vocab_size),
            **(self._inside(req) if finished and req.recording is not None else {}))

    def _inside(self, req: Request) -> dict[str, Any]:
        """A finished request's `activations` and `logit_lens` as data (`ActivationData`,
        `LogitLensData`), with its tokens' texts; the facades make views of them."""
        recording, seq = req.recording, req.sequences[0]
        assert recording is not None
        tokens = [self.texts(t) for t in seq.token_ids]
        out: dict[str, Any] = {}
        if recording.inside.capture is not None:
            out["activations"] = recording.activations(tokens)
        if recording.inside.logit_lens is not None:
            out["logit_lens"] = recording.lens(tokens, self.texts)
        if recording.inside.features is not None:
            out["features"] = recording.features(tokens)
        return out

    def _completion(self, seq: Sequence, delta: bool) -> CompletionOutput | None:
        done = seq.is_finished
        detok = self._detok(seq)
        if done:
            detok.flush()
        start = seq.num_sent_tokens if delta else 0
        ids = seq.output_token_ids[start:]
        text = detok.delta(done) if delta else detok.visible(done)
        if delta and not ids and not text and not done:
            return None
        if delta:
            seq.num_sent_tokens = seq.num_output_tokens
            if done and seq.final_sent:
                return None
            seq.final_sent = done
        logprobs = None if seq.logprobs is None else seq.logprobs[start:]
        stats = None if seq.token_stats is None else seq.token_stats[start:]
        return CompletionOutput(
            index=seq.index, text=text, token_ids=ids,
            cumulative_logprob=seq.cumulative_logprob if seq.logprobs is not None else None,
            logprobs=logprobs, finish_reason=seq.finish_reason, stop_reason=seq.stop_reason,
            lora_request=seq.request.lora_request,
            grammar_steps=None if seq.grammar_matcher is None
            else seq.grammar_matcher.steps[start:], token_stats=stats)
