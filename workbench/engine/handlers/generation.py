"""Generation requests: `n` samples, each step one sampled token per sequence.

Every row of the step's generation batch (a finished prompt's `n - 1` new siblings on its
row: the bookkeeper forked them) goes through one sampler call; when that call fails, each row
is sampled alone so that only the request at fault ends with 'error'. The sampled tokens go to
the step's results; the bookkeeper appends them and checks the stops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from workbench.engine.handlers.base import KindHandler
from workbench.engine.requests.outputs import CompletionOutput, RequestOutput
from workbench.engine.requests.structured import attach_grammar_masks
from workbench.engine.step.sampler import SamplingRow
from workbench.errors import ValidationError

if TYPE_CHECKING:
    from workbench.engine.requests.input_processor import InputProcessor, PromptInput
    from workbench.engine.requests.output_processor import OutputProcessor
    from workbench.engine.requests.request import Request, Sequence
    from workbench.engine.requests.step_results import SampledToken, StepResults
    from workbench.engine.step.runner import LogitRows
    from workbench.engine.step.sampler import Sampler
    from workbench.sampling_params import SamplingParams


class GenerationHandler(KindHandler):
    """Sampled generation (`LLMEngine.add_request`)."""

    kind = "generate"

    def __init__(self, inputs: InputProcessor, outputs: OutputProcessor, sampler: Sampler,
                 vocab_size: int, max_num_seqs: int):
        self.inputs = inputs
        self.outputs = outputs
        self.sampler = sampler
        self.vocab_size = vocab_size
        self.max_num_seqs = max_num_seqs

    def make_request(self, request_id: str, prompt: PromptInput, params: SamplingParams,
                     **request_kwargs: Any) -> Request:
        """A checked generation `Request`; raises `ValidationError` for what can't be served."""
        if params.n > self.max_num_seqs:  # its samples could never all run: stuck forever
            raise ValidationError(f"n={params.n} is greater than max_num_seqs={self.max_num_seqs}.",
                                  parameter="n", value=params.n)
        return self.inputs.process(request_id, prompt, params, **request_kwargs)

    def compute(self, batch: list[tuple[Sequence, int]], rows: LogitRows,
                results: StepResults) -> None:
        """One sampled token per sequence, all rows in one sampler call where it can."""
        if not batch:
            return
        logits = rows.logits
        picked = [r for _, r in batch]
        if picked != list(range(len(logits))):  # most steps: every row, in order: no copy
            logits = logits[picked]
        seqs = [s for s, _ in batch]
        try:
            results.sampled += zip(seqs, self._sample_rows(seqs, logits))
        except Exception:  # noqa: BLE001 - one request's row may be at fault: each row alone
            for i, seq in enumerate(seqs):
                if results.has_failed(seq.request):
                    continue
                try:
                    results.sampled += zip([seq], self._sample_rows([seq], logits[i:i + 1]))
                except Exception as exc:  # noqa: BLE001 - contained to this request
                    results.fail(seq.request, exc)

    def _sample_rows(self, seqs: list[Sequence], logits: torch.Tensor) -> list[SampledToken]:
        """One token per row: (token, logprob, rank, top ids, top logprobs, tracked ids'
        logprobs, token stats) for each."""
        rows = [SamplingRow(s.request.params,  # embedded prompts have no ids to penalize
                            [] if s.request.prompt_embeds is not None else s.request.prompt_token_ids,
                            s.output_token_ids,
                            s.generator, s.request.min_tokens_stop_ids,
                            forced_token=None if s.thinking is None
                            else s.thinking.forced_token(s.output_token_ids)) for s in seqs]
        attach_grammar_masks(seqs, rows, logits, self.vocab_size)
        result = self.sampler(logits, rows)
        n = len(seqs)

        def column(t: torch.Tensor | None) -> list:
            return t.tolist() if t is not None else [None] * n

        return list(zip(result.tokens.tolist(), column(result.token_logprobs),
                        column(result.ranks), column(result.top_ids), column(result.top_logprobs),
                        result.tracked or [None] * n, result.stats or [None] * n))

    def output(self, req: Request) -> RequestOutput | None:
        return self.outputs.make_output(req)

    def error_output(self, req: Request) -> RequestOutput:
        outputs = [CompletionOutput(index=s.index, text="", token_ids=list(s.output_token_ids),
                                    cumulative_logprob=None, logprobs=None, finish_reason="error")
                   for s in req.sequences]
        return RequestOutput(request_id=req.request_id, prompt=req.prompt,
                             prompt_token_ids=req.prompt_token_ids, prompt_logprobs=None,
                             outputs=outputs, finished=True, error=req.error)
