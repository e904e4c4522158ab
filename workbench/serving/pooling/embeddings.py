"""`/v1/embeddings`: texts, token ids or chat messages -> one embedding each.

Pipeline stages come from `PoolingServing`; this module supplies the hooks and the response:
`{"object": "list", "data": [{"index", "object": "embedding", "embedding"}], "usage"}`, the
embedding as floats or base64 (`encoding.py`). `dimensions` (Matryoshka truncation) goes to the
engine's `PoolingParams.verify`, which refuses it with the reference's message on models not
trained for it.
"""

from __future__ import annotations

from typing import Any

from workbench.pooling_params import PoolingParams
from workbench.serving.base import ServeContext
from workbench.serving.pooling.base import PoolingServing
from workbench.serving.pooling.checks import check_common, check_encoding
from workbench.serving.pooling.encoding import encode_outputs
from workbench.serving.protocol.common import UsageInfo
from workbench.serving.protocol.pooling import EmbeddingResponse, EmbeddingResponseData


def pooling_usage(ctx: ServeContext) -> UsageInfo:
    tokens = ctx.num_prompt_tokens
    return UsageInfo(prompt_tokens=tokens, total_tokens=tokens, completion_tokens=0)


class EmbeddingServing(PoolingServing):
    id_prefix = "embd"
    operation = "embedding generation"

    def validate(self, ctx: ServeContext) -> None:
        super().validate(ctx)
        request = ctx.request
        check_common(request)
        check_encoding(request)

    def preprocess(self, ctx: ServeContext) -> None:
        ctx.engine_prompts = self.text_or_chat_prompts(ctx.request)

    def build_params(self, ctx: ServeContext) -> list[Any]:
        self.check_task("embed")
        params = PoolingParams(task="embed", dimensions=ctx.request.dimensions,
                               use_activation=ctx.request.use_activation)
        return [params] * len(ctx.require_prompts())

    async def build_response(self, ctx: ServeContext) -> EmbeddingResponse:
        encoded = encode_outputs(ctx.request, ctx.require_results())
        data = [EmbeddingResponseData(index=i, embedding=value) for i, value in enumerate(encoded)]
        return EmbeddingResponse(id=ctx.request_id, created=ctx.created, model=ctx.model_name,
                                 data=data, usage=pooling_usage(ctx))
