"""`/classify`: texts or chat messages -> label probabilities.

On a classifier the labels are its `id2label`; on a generative model they are label words
(`--classifier-labels`, e.g. "no yes"), scored by the next-token logits of their first tokens
after the input (the engine's label-token classifier). `use_activation` false returns the raw
scores instead of softmax probabilities. `label` is the most probable class.
"""

from __future__ import annotations

from typing import Any

from workbench.pooling_params import PoolingParams
from workbench.serving.base import ServeContext
from workbench.serving.pooling.base import PoolingServing
from workbench.serving.pooling.checks import check_common
from workbench.serving.pooling.embeddings import pooling_usage
from workbench.serving.protocol.pooling import ClassificationData, ClassificationResponse


class ClassifyServing(PoolingServing):
    id_prefix = "classify"
    operation = "classification"

    @property
    def labels(self) -> list[str] | None:
        labels = self.engine.classifier_labels
        return list(labels) if labels else None

    def validate(self, ctx: ServeContext) -> None:
        super().validate(ctx)
        request = ctx.request
        check_common(request)

    def preprocess(self, ctx: ServeContext) -> None:
        ctx.engine_prompts = self.text_or_chat_prompts(ctx.request)

    def build_params(self, ctx: ServeContext) -> list[Any]:
        self.check_task("classify")
        params = PoolingParams(task="classify", use_activation=ctx.request.use_activation)
        return [params] * len(ctx.require_prompts())

    async def build_response(self, ctx: ServeContext) -> ClassificationResponse:
        labels = self.labels
        data = []
        for i, out in enumerate(ctx.require_results()):
            probs = [float(p) for p in out.outputs.data.detach().to("cpu").float().reshape(-1)]
            best = max(range(len(probs)), key=probs.__getitem__)
            label = labels[best] if labels and best < len(labels) else str(best)
            data.append(ClassificationData(index=i, label=label, probs=probs,
                                           num_classes=len(probs)))
        return ClassificationResponse(id=ctx.request_id, created=ctx.created,
                                      model=ctx.model_name, data=data, usage=pooling_usage(ctx))
