"""`/rerank`, `/v1/rerank`, `/v2/rerank`: one query, documents ranked best first.

Scores come from `ScoreServing` (cosine of embeddings, or the yes-probability on a generative
model). Results are sorted by `relevance_score`, highest first, ties in document order (a
stable sort), cut to `top_n` (0: all); each carries its document's `index` and, unless
`return_documents` is false (Cohere's field; the reference always echoes), the document text.
As in the reference, an over-long input is refused naming "embedding generation".
"""

from __future__ import annotations

from typing import Any

from workbench.serving.base import ServeContext
from workbench.serving.pooling.score import ScoreServing, pair_up
from workbench.serving.protocol.pooling import (
    RerankDocument,
    RerankResponse,
    RerankResult,
    RerankUsage,
)


def ranked(scores: list[float], top_n: int = 0) -> list[int]:
    """Document indices, best first; equal scores keep document order; `top_n` 0 = all.

    >>> ranked([0.1, 0.9, 0.5, 0.9], top_n=3)
    [1, 3, 2]
    """
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return order[:top_n] if top_n > 0 else order


class RerankServing(ScoreServing):
    id_prefix = "rerank"
    operation = "embedding generation"

    def pairs(self, request: Any) -> list[tuple[str, str]]:
        query = self.first_tokens(request.query, request.max_tokens_per_query)
        documents = [self.first_tokens(d, request.max_tokens_per_doc) for d in request.documents]
        return pair_up([query], documents, ("query", "documents"))

    async def build_response(self, ctx: ServeContext) -> RerankResponse:
        request = ctx.request
        scores = self.scores(ctx)
        results = [RerankResult(index=i, relevance_score=scores[i],
                                document=RerankDocument(text=request.documents[i])
                                if request.return_documents else None)
                   for i in ranked(scores, request.top_n)]
        tokens = ctx.num_prompt_tokens
        return RerankResponse(id=ctx.request_id, model=ctx.model_name, results=results,
                              usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens))
