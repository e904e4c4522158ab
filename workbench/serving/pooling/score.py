"""`/score`: relevance of text pairs, one-to-one, one-to-many or many-to-many.

Two ways to score, chosen by the model:
- bi-encoder (an embedding model such as all-MiniLM-L6-v2): both texts of a pair are embedded
  and the score is the cosine similarity of their embeddings (the reference's `embed` mode);
- label tokens (a generative model): each pair becomes a judgement prompt ("does the document
  answer the query? yes/no") and the score is the probability of "yes" as the next token (the
  engine's `score` task; the technique behind LLM-based rerankers).

Pairs: `queries`+`documents` (or `items`), `data_1`+`data_2` or `text_1`+`text_2`; one first
text is paired with every second text (1:N), otherwise the lists pair up (N:N).
`max_tokens_per_query` / `max_tokens_per_doc` keep the first N tokens of each side (0: all).
"""

from __future__ import annotations

from typing import Any

from workbench.errors import ValidationError
from workbench.pooling_params import PoolingParams
from workbench.serving.base import ServeContext
from workbench.serving.pooling.base import PoolingServing
from workbench.serving.pooling.checks import check_common, check_score_extras
from workbench.serving.pooling.embeddings import pooling_usage
from workbench.serving.prompts import EnginePrompt
from workbench.serving.protocol.common import OpenAIBaseModel
from workbench.serving.protocol.pooling import ScoreResponse, ScoreResponseData

NO_TEXT = "At least one text element must be given"
NO_TEXT_PAIR = "At least one text_pair element must be given"
BAD_CARDINALITY = "Input lengths must be either 1:1, 1:N or N:N"


def pair_up(first: list[str], second: list[str], names: tuple[str, str] = ("queries",
            "documents")) -> list[tuple[str, str]]:
    """The pairs a score request means: 1:1, 1:N (the one first text repeated) or N:N."""
    if not first:
        raise ValidationError(NO_TEXT, parameter=names[0])
    if not second:
        raise ValidationError(NO_TEXT_PAIR, parameter=names[1])
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise ValidationError(BAD_CARDINALITY, parameter=names[1])
    return list(zip(first, second))


def cosine(a: Any, b: Any) -> float:
    from workbench.engine.step.pooling import cosine as tensor_cosine  # deferred: imports torch

    return float(tensor_cosine(a.reshape(-1), b.reshape(-1)))


class ScoreServing(PoolingServing):
    id_prefix = "score"
    operation = "score"

    @property
    def bi_encoder(self) -> bool:
        """Cosine of embeddings on an embedding model; label tokens on a generative one."""
        return self.engine.is_pooling_model and "embed" in self.tasks

    def validate(self, ctx: ServeContext) -> None:
        super().validate(ctx)
        request = ctx.request
        check_common(request)
        check_score_extras(request)
        if request.instruction is not None and self.bi_encoder:
            raise ValidationError("`instruction` applies to scoring with a generative model's "
                                  "judgement prompt; an embedding model scores by cosine "
                                  "similarity.", parameter="instruction")

    def pairs(self, request: Any) -> list[tuple[str, str]]:
        first_name, first, second_name, second = request.sides()
        first = [self.first_tokens(t, request.max_tokens_per_query) for t in first]
        second = [self.first_tokens(t, request.max_tokens_per_doc) for t in second]
        return pair_up(first, second, (first_name, second_name))

    def first_tokens(self, text: str, limit: int) -> str:
        """`text` cut to its first `limit` tokens (0: whole)."""
        if not limit:
            return text
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return text if len(ids) <= limit else self.tokenizer.decode(ids[:limit])

    def preprocess(self, ctx: ServeContext) -> None:
        ctx.engine_prompts = self.pair_prompts(ctx, self.pairs(ctx.request))

    def pair_prompts(self, ctx: ServeContext, pairs: list[tuple[str, str]]
                     ) -> list[EnginePrompt]:
        """Bi-encoder: [query 0, document 0, query 1, ...]; label tokens: one prompt a pair."""
        request = ctx.request
        text = self.pooling_prompts.from_text
        kwargs = {"truncate": request.truncate_prompt_tokens, "side": request.truncation_side}
        if self.bi_encoder:
            return [text(t, **kwargs) for pair in pairs for t in pair]
        return [self.judgement_prompt(query, document, request.instruction, **kwargs)
                for query, document in pairs]

    def judgement_prompt(self, query: str, document: str, instruction: str | None,
                         **kwargs: Any) -> EnginePrompt:
        """The engine's relevance prompt (chat-templated: no extra special tokens)."""
        # deferred: workbench.engine.step.pooling imports torch
        from workbench.engine.step.pooling import JUDGEMENT_INSTRUCTION, judgement_prompt

        text = judgement_prompt(query, document, self.tokenizer,
                                instruction=instruction or JUDGEMENT_INSTRUCTION)
        return self.pooling_prompts.from_text(text, add_special_tokens=False, **kwargs)

    def build_params(self, ctx: ServeContext) -> list[Any]:
        task = "embed" if self.bi_encoder else "score"
        self.check_task(task)
        params = PoolingParams(task=task, use_activation=ctx.request.use_activation)
        return [params] * len(ctx.require_prompts())

    def scores(self, ctx: ServeContext) -> list[float]:
        """One score per pair, in pair order."""
        outs = [out.outputs.data for out in ctx.require_results()]
        if self.bi_encoder:
            return [cosine(outs[2 * i], outs[2 * i + 1]) for i in range(len(outs) // 2)]
        return [float(data.detach().float().reshape(-1)[0]) for data in outs]

    async def build_response(self, ctx: ServeContext) -> OpenAIBaseModel:  # rerank: its own
        data = [ScoreResponseData(index=i, score=s) for i, s in enumerate(self.scores(ctx))]
        return ScoreResponse(id=ctx.request_id, created=ctx.created, model=ctx.model_name,
                             data=data, usage=pooling_usage(ctx))
