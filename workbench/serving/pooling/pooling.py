"""`/pooling`: the pooler's raw output for any pooling task the model serves.

`task` picks the output (`embed`: the embedding; `classify`: label probabilities; `encode`:
the pooled hidden state unnormalized; `score`: a relevance score); unset, it is the model's
default task (`embed` on an embedding model, `classify` on a generative one). The response's `data` items carry the tensor as nested
floats or base64 (`encoding.py`).
"""

from __future__ import annotations

from typing import Any

from workbench.pooling_params import PoolingParams
from workbench.serving.base import ServeContext
from workbench.serving.pooling.base import PoolingServing
from workbench.serving.pooling.checks import check_common, check_encoding
from workbench.serving.pooling.embeddings import pooling_usage
from workbench.serving.pooling.encoding import encode_outputs
from workbench.serving.protocol.pooling import PoolingResponse, PoolingResponseData


class PoolingEndpointServing(PoolingServing):
    id_prefix = "pool"
    operation = "embedding generation"  # the reference names pooling inputs so too

    def default_task(self) -> str:
        """The model's default task (the engine lists it first)."""
        return self.tasks[0] if self.tasks else "embed"

    def validate(self, ctx: ServeContext) -> None:
        super().validate(ctx)
        request = ctx.request
        check_common(request)
        check_encoding(request)

    def preprocess(self, ctx: ServeContext) -> None:
        ctx.engine_prompts = self.text_or_chat_prompts(ctx.request)

    def build_params(self, ctx: ServeContext) -> list[Any]:
        request = ctx.request
        task = request.task or self.default_task()
        self.check_task(task)
        params = PoolingParams(task=task, dimensions=request.dimensions,
                               use_activation=request.use_activation)
        return [params] * len(ctx.require_prompts())

    async def build_response(self, ctx: ServeContext) -> PoolingResponse:
        encoded = encode_outputs(ctx.request, ctx.require_results())
        data = [PoolingResponseData(index=i, data=value) for i, value in enumerate(encoded)]
        return PoolingResponse(id=ctx.request_id, created=ctx.created, model=ctx.model_name,
                               data=data, usage=pooling_usage(ctx))
