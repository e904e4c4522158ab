"""Generation requests: `n` samples, each step one sampled token per sequence.

When a request with `n > 1` finishes its prompt, its `n - 1` siblings are forked from the first
sequence (sharing the prompt's KV blocks) and sampled from the same row in that step. Every
row of the step's generation batch goes through one sampler call; when that call fails, each
row is sampled alone so that only the request at fault ends with 'error'.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from workbench.engine.handlers.base import KindHandler
from workbench.engine.outputs import CompletionOutput, RequestOutput
from workbench.engine.sampler import SamplingRow
from workbench.engine.structured import attach_grammar_masks
from workbench.errors import ValidationError

if TYPE_CHECKING:
    from workbench.engine.input_processor import PromptInput
    from workbench.engine.request import Request, Sequence
    from workbench.engine.runner import LogitRows
    from workbench.sampling_params import SamplingParams


class GenerationHandler(KindHandler):
    """Sampled generation (`LLMEngine.add_request`)."""

    def make_request(self, request_id: str, prompt: PromptInput, params: SamplingParams,
                     **request_kwargs) -> Request:
        """A checked generation `Request`; raises `ValidationError` for what can't be served."""
        max_num_seqs = self.engine.config.max_num_seqs
        if params.n > max_num_seqs:  # its samples could never all run: stuck forever
            raise ValidationError(f"n={params.n} is greater than max_num_seqs={max_num_seqs}.",
                                  parameter="n", value=params.n)
        return self.engine.inputs.process(request_id, prompt, params, **request_kwargs)

    def advance(self, batch: list[tuple[Sequence, int]], rows: LogitRows) -> None:
        to_sample: list[tuple[Sequence, int]] = []
        for seq, row in batch:
            to_sample.append((seq, row))
            req = seq.request
            if req.params.n > 1 and not req.forked:  # its prompt is done: the siblings start
                try:
                    to_sample += [(child, row) for child in self._fork(seq)]
                except Exception as exc:  # noqa: BLE001 - contained to this request
                    self.engine.fail_request(req, exc)
        self._sample([(s, r) for s, r in to_sample if not s.request.errored], rows.logits)

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """The n - 1 siblings of a sequence whose prompt was just computed."""
        engine, req = self.engine, parent.request
        req.forked = True
        children = []
        for index in range(1, req.params.n):
            child = parent.fork(index)
            engine.block_manager.fork(parent, child)
            engine.start_sequence(child)
            req.sequences.append(child)
            engine.scheduler.add_running(child)
            children.append(child)
        return children

    def _sample(self, to_sample: list[tuple[Sequence, int]], logits: torch.Tensor) -> None:
        if not to_sample:
            return
        picked = [r for _, r in to_sample]
        if picked != list(range(len(logits))):  # most steps: every row, in order: no copy
            logits = logits[picked]
        seqs = [s for s, _ in to_sample]
        try:
            sampled = list(zip(seqs, self._sample_rows(seqs, logits)))
        except Exception:  # noqa: BLE001 - one request's row may be at fault: each row alone
            sampled = []
            for i, seq in enumerate(seqs):
                if seq.request.errored:
                    continue
                try:
                    sampled += zip([seq], self._sample_rows([seq], logits[i:i + 1]))
                except Exception as exc:  # noqa: BLE001 - contained to this request
                    self.engine.fail_request(seq.request, exc)
        now = time.time()
        for seq, values in sampled:
            if not seq.request.errored:  # else a sibling of this sample failed
                self._append(seq, values, now)

    def _append(self, seq: Sequence, values: tuple, now: float) -> None:
        """Adds a sampled token (detokenize, stop checks); finishes the sequence if it stops."""
        engine = self.engine
        m = seq.request.metrics
        m.first_token_time = m.first_token_time or now
        m.last_token_time = now
        try:
            engine.outputs.append_token(seq, *values)
        except Exception as exc:  # noqa: BLE001 - e.g. detokenization: this request only
            engine.fail_request(seq.request, exc)
            return
        engine.generation_tokens_total += 1
        if seq.finish_reason is not None:
            engine.scheduler.finish(seq)

    def _sample_rows(self, seqs: list[Sequence], logits: torch.Tensor) -> list[tuple]:
        """One token per row: (token, logprob, rank, top ids, top logprobs, tracked ids'
        logprobs) for each."""
        rows = [SamplingRow(s.request.params,  # embedded prompts have no ids to penalize
                            [] if s.request.prompt_embeds is not None else s.request.prompt_token_ids,
                            s.output_token_ids,
                            s.generator, s.request.min_tokens_stop_ids,
                            forced_token=None if s.thinking is None
                            else s.thinking.forced_token(s.output_token_ids)) for s in seqs]
        vocab_size = self.engine.vocab_size
        attach_grammar_masks(seqs, rows, logits, vocab_size)
        result = self.engine.sampler(logits, rows)
        n = len(seqs)

        def column(t: torch.Tensor | None) -> list:
            return t.tolist() if t is not None else [None] * n

        return list(zip(result.tokens.tolist(), column(result.token_logprobs),
                        column(result.ranks), column(result.top_ids), column(result.top_logprobs),
                        result.tracked or [None] * n))

    def output(self, req: Request) -> RequestOutput | None:
        return self.engine.outputs.make_output(req)

    def error_output(self, req: Request) -> RequestOutput:
        outputs = [CompletionOutput(index=s.index, text="", token_ids=list(s.output_token_ids),
                                    cumulative_logprob=None, logprobs=None, finish_reason="error")
                   for s in req.sequences]
        return RequestOutput(request_id=req.request_id, prompt=req.prompt,
                             prompt_token_ids=req.prompt_token_ids, prompt_logprobs=None,
                             outputs=outputs, finished=True)
