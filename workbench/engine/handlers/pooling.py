"""Pooling requests (embed / classify / score / encode): computing the prompt is the whole job.

The step that computes a request's last prompt token gives its task's result from that row's
final hidden state (and, on a generative model, its next-token logits of the label tokens:
`engine/step/pooling.py`), which the bookkeeper stores before it finishes the request and frees
its blocks. It reports once, when it ends: its result, or empty data with finish_reason
'abort' or 'error'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from workbench.engine.handlers.base import KindHandler
from workbench.engine.requests.outputs import PoolingOutput, PoolingRequestOutput
from workbench.engine.step.pooling import finish as pool_finish
from workbench.engine.step.pooling import pooling_request

if TYPE_CHECKING:
    from workbench.engine.requests.input_processor import InputProcessor, PromptInput
    from workbench.engine.requests.request import Request, Sequence
    from workbench.engine.requests.step_results import StepResults
    from workbench.engine.step.runner import LogitRows
    from workbench.pooling_params import PoolingParams


class PoolingHandler(KindHandler):
    """Pooling tasks (`LLMEngine.add_pooling_request`)."""

    kind = "pool"

    def __init__(self, inputs: InputProcessor, tasks: tuple[str, ...], model_name: str,
                 hidden_size: int, default_normalize: bool, label_ids: list[int] | None):
        self.inputs = inputs
        self.tasks = tasks  # the model's pooling tasks, its default first
        self.model_name = model_name
        self.hidden_size = hidden_size
        self.default_normalize = default_normalize
        self.label_ids = label_ids  # a generative model's classifier label tokens

    def make_request(self, request_id: str, prompt: PromptInput, params: PoolingParams,
                     **request_kwargs) -> Request:
        """A checked pooling `Request` (its params verified against this model)."""
        params = params.verify(self.tasks, self.model_name, self.hidden_size,
                               default_normalize=self.default_normalize)
        return pooling_request(self.inputs, request_id, prompt, params, **request_kwargs)

    def compute(self, batch: list[tuple[Sequence, int]], rows: LogitRows,
                results: StepResults) -> None:
        """The result of each request whose prompt is computed (it then finishes)."""
        for seq, row in batch:
            req = seq.request
            try:
                params, hidden = req.pooling, rows.hidden
                assert params is not None and hidden is not None  # a pooling request's step
                logits = rows.logits[row] if rows.logits.shape[-1] else None  # none: an encoder
                results.pooled.append((seq, pool_finish(params, hidden[row], logits,
                                                        self.label_ids)))
            except Exception as exc:  # noqa: BLE001 - contained to this request
                results.fail(req, exc)

    def output(self, req: Request) -> PoolingRequestOutput | None:
        if not req.finished:
            return None
        reason = req.sequences[0].finish_reason or "abort"
        data = req.pooled if reason == "stop" and req.pooled is not None else torch.empty(0)
        return PoolingRequestOutput(req.request_id, PoolingOutput(data), req.prompt_token_ids,
                                    req.num_cached_tokens, True, reason, req.prompt,
                                    error=req.error)

    def error_output(self, req: Request) -> PoolingRequestOutput | None:
        return self.output(req)  # a failed request is finished: its (empty) result
