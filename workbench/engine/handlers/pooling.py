"""Pooling requests (embed / classify / score / encode): computing the prompt is the whole job.

The step that computes a request's last prompt token gives its task's result from that row's
final hidden state (and, on a generative model, its next-token logits of the label tokens:
`engine/pooling.py`); the request then finishes and frees its blocks. It reports once, when it
ends: its result, or empty data with finish_reason 'abort' or 'error'.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from workbench.engine.handlers.base import KindHandler
from workbench.engine.outputs import PoolingOutput, PoolingRequestOutput
from workbench.engine.pooling import finish as pool_finish
from workbench.engine.pooling import pooling_request

if TYPE_CHECKING:
    from workbench.engine.engine import LLMEngine
    from workbench.engine.input_processor import PromptInput
    from workbench.engine.request import Request, Sequence
    from workbench.engine.runner import LogitRows
    from workbench.pooling_params import PoolingParams


class PoolingHandler(KindHandler):
    """Pooling tasks (`LLMEngine.add_pooling_request`)."""

    def __init__(self, engine: LLMEngine, label_ids: list[int] | None):
        super().__init__(engine)
        self.label_ids = label_ids  # a generative model's classifier label tokens

    def make_request(self, request_id: str, prompt: PromptInput, params: PoolingParams,
                     **request_kwargs) -> Request:
        """A checked pooling `Request` (its params verified against this model)."""
        engine = self.engine
        default_normalize = (getattr(engine.loaded, "normalize", True) if engine.is_pooling_model
                             else True)
        params = params.verify(engine.pooling_tasks, engine.served_model_name,
                               engine.model.config.hidden_size,
                               default_normalize=default_normalize)
        return pooling_request(engine.inputs, request_id, prompt, params, **request_kwargs)

    def advance(self, batch: list[tuple[Sequence, int]], rows: LogitRows) -> None:
        """Requests whose prompt is computed get their result and finish (blocks freed)."""
        now = time.time()
        for seq, row in batch:
            req = seq.request
            try:
                params, hidden = req.pooling, rows.hidden
                assert params is not None and hidden is not None  # a pooling request's step
                logits = rows.logits[row] if rows.logits.shape[-1] else None  # none: an encoder
                req.pooled = pool_finish(params, hidden[row], logits, self.label_ids)
            except Exception as exc:  # noqa: BLE001 - contained to this request
                self.engine.fail_request(req, exc)
                continue
            req.metrics.first_token_time = req.metrics.last_token_time = now
            seq.finish_reason = "stop"
            self.engine.scheduler.finish(seq)

    def output(self, req: Request) -> PoolingRequestOutput | None:
        if not req.finished:
            return None
        reason = req.sequences[0].finish_reason or "abort"
        data = req.pooled if reason == "stop" and req.pooled is not None else torch.empty(0)
        return PoolingRequestOutput(req.request_id, PoolingOutput(data), req.prompt_token_ids,
                                    req.num_cached_tokens, True, reason, req.prompt)

    def error_output(self, req: Request) -> PoolingRequestOutput | None:
        return self.output(req)  # a failed request is finished: its (empty) result
