"""The pooling endpoints on the reference's pooling pipeline (`base.py`): `/v1/embeddings`,
`/pooling`, `/classify`, `/score` and `/rerank`, each a `PoolingServing` with its hooks."""

from workbench.serving.pooling.base import PoolingServing
from workbench.serving.pooling.classify import ClassifyServing
from workbench.serving.pooling.embeddings import EmbeddingServing
from workbench.serving.pooling.pooling import PoolingEndpointServing
from workbench.serving.pooling.rerank import RerankServing
from workbench.serving.pooling.score import ScoreServing

__all__ = ["ClassifyServing", "EmbeddingServing", "PoolingEndpointServing",
           "PoolingServing", "RerankServing", "ScoreServing"]
