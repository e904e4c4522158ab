"""`Workbench.embed / score / rerank / classify / pool`, in the kernel and against a URL."""

from __future__ import annotations

import numpy as np
import pytest

SENTENCES = ["A cat sits on the mat.", "A kitten rests on a rug.", "Stocks fell sharply today."]


@pytest.fixture(scope="module")
def encoder():
    from workbench import LLM

    return LLM(model="all-minilm-l6-v2", dtype="float32")


@pytest.fixture(scope="module")
def local(encoder):
    from workbench import Workbench

    with Workbench(encoder) as wb:
        yield wb


@pytest.fixture(scope="module")
def remote(encoder):
    from workbench import Workbench, serve_in_kernel

    with serve_in_kernel(encoder, port=0) as server, Workbench(url=server.base_url) as wb:
        yield wb


def test_embed_similarity_local_equals_remote(local, remote):
    here, there = local.embed(SENTENCES), remote.embed(SENTENCES)
    assert here.ok and there.ok
    assert here.similarity.shape == (3, 3)
    assert here.similarity.best(SENTENCES[0]) == SENTENCES[1]
    assert np.allclose(here.similarity.values, there.similarity.values, atol=1e-6)
    assert [s.name for s in here.trace.spans][:2] == ["check model", "validate"]
    assert here.report.ok and {c.name for c in here.report.passed} >= {"model", "pooling parameters"}


def test_score_and_rerank_agree(local, remote):
    scored = local.score(SENTENCES[0], SENTENCES[1:])
    ranked = remote.rerank(SENTENCES[0], SENTENCES[1:])
    assert np.allclose(scored.similarity.values, ranked.similarity.values, atol=1e-6)
    assert [r["index"] for r in ranked.response["results"]] == [0, 1]


def test_errors_come_back_as_envelopes(local, remote):
    for wb in (local, remote):
        result = wb.embed("x", dimensions=4)
        assert not result.ok and result.status_code == 400
        assert result.error["error"]["param"] == "dimensions"
        assert wb.classify("x").status_code == 404 if wb is remote else True
    refused = local.classify("x")
    assert refused.error["error"]["message"].startswith("Unsupported task: 'classify'")
    assert [c.name for c in refused.report.failed] == ["pooling parameters"]
    engine_refusal = local.embed("x", dimensions=4).report  # refused when the engine gets it
    assert not engine_refusal.ok and engine_refusal.error["error"]["param"] == "dimensions"
    assert local.score([], ["a"]).error["error"]["message"].startswith(
        "At least one text element must be given")


def test_pool_tasks(local):
    assert local.pool("x").response["data"][0]["object"] == "pooling"
    assert local.pool("x", task="bogus").status_code == 400
