"""workbench.apps.bench's embedding benchmark: both sides compute the same embeddings (no timing)."""

from __future__ import annotations

import torch.nn.functional as F

from workbench.apps import bench
from workbench.apps.bench_embed import corpus, hf_embed, ours_embed
from workbench.llm import LLM


def test_the_corpus_is_seeded_and_of_mixed_lengths():
    texts = corpus(64)
    assert texts == corpus(64) and texts != corpus(64, seed=1)
    words = [len(t.split()) for t in texts]
    assert min(words) <= 8 and max(words) >= 30


def test_both_sides_embed_alike():
    from workbench.models import tiny_model

    texts = corpus(40)
    ours = ours_embed(LLM(tiny_model("bert", seed=0), max_model_len=128), texts)
    theirs = hf_embed(tiny_model("bert", seed=0), texts, batch_size=8)
    assert ours.shape == theirs.shape == (40, 64)
    assert F.cosine_similarity(ours, theirs, dim=-1).min() >= 0.9999


def test_the_embedding_benchmark_is_registered():
    assert bench.bench_embed in bench.BENCHMARKS
    assert bench.BenchConfig.quick().embed_sentences < bench.BenchConfig().embed_sentences
