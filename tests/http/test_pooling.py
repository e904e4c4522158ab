"""The pooling endpoints over HTTP with the official `openai` client and httpx.

An embedding model (all-MiniLM-L6-v2, fp32) serves `/v1/embeddings`, `/pooling`, `/score`
and `/rerank` but no generation routes; the generative model (the shared SmolLM2 server)
keeps its generation routes and adds `/classify`, `/score` and `/rerank` through label tokens.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest

EMBED_MODEL = "all-minilm-l6-v2"
SENTENCES = ["A cat sits on the mat.", "A kitten rests on a rug.", "Stocks fell sharply today."]


@pytest.fixture(scope="module")
def embed_server():
    from workbench import LLM, serve_in_kernel

    handle = serve_in_kernel(LLM(model=EMBED_MODEL, dtype="float32"), port=0)
    yield handle
    handle.stop()


@pytest.fixture
def eclient(embed_server):
    import openai

    return openai.OpenAI(base_url=embed_server.base_url, api_key="unused", max_retries=0,
                         timeout=120)


@pytest.fixture
def ehttp(embed_server):
    import httpx

    with httpx.Client(base_url=embed_server.url, timeout=120) as c:
        yield c


def reference_embeddings(texts: list[str]) -> np.ndarray:
    """sentence-transformers' recipe with plain transformers: mean pooling, L2 normalization."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from workbench.models import resolve_model

    path = resolve_model(EMBED_MODEL).path
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, torch_dtype=torch.float32).eval()
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state  # [B, T, H]
    mask = batch["attention_mask"].unsqueeze(-1).float()
    mean = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(mean, dim=-1).numpy()


def error_of(response) -> dict:
    assert response.status_code == 400, response.text
    return response.json()["error"]


# -- /v1/embeddings ---------------------------------------------------------------------------
def test_openai_client_embeddings_match_transformers(eclient):
    result = eclient.embeddings.create(model=EMBED_MODEL, input=SENTENCES)  # base64 by default
    got = np.array([d.embedding for d in result.data])
    want = reference_embeddings(SENTENCES)
    cosines = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosines.min() >= 0.9999
    assert [d.index for d in result.data] == [0, 1, 2]
    assert result.usage.prompt_tokens == result.usage.total_tokens > 0


def test_base64_is_the_same_floats(ehttp):
    floats = ehttp.post("/v1/embeddings", json={"input": SENTENCES[:2]}).json()
    b64 = ehttp.post("/v1/embeddings", json={"input": SENTENCES[:2],
                                              "encoding_format": "base64"}).json()
    for f, b in zip(floats["data"], b64["data"]):  # two requests: batched alike or not, so
        np.testing.assert_allclose(  # equal up to float32 noise (a bad encoding is garbage)
            np.frombuffer(base64.b64decode(b["embedding"]), dtype="float32"), f["embedding"],
            rtol=1e-5, atol=1e-6)


def test_embeddings_of_token_ids_equal_those_of_text(ehttp, eclient):
    ids = ehttp.post("/tokenize", json={"prompt": SENTENCES[0]}).json()["tokens"]
    by_text = eclient.embeddings.create(model=EMBED_MODEL, input=SENTENCES[0],
                                        encoding_format="float").data[0].embedding
    by_ids = eclient.embeddings.create(model=EMBED_MODEL, input=[ids, ids],
                                       encoding_format="float").data
    assert by_ids[0].embedding == by_ids[1].embedding
    assert np.allclose(by_ids[0].embedding, by_text, atol=1e-6)


def test_dimensions_refused_with_the_reference_message(eclient):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        eclient.embeddings.create(model=EMBED_MODEL, input="x", dimensions=8)
    error = info.value.body
    assert error["param"] == "dimensions"
    assert error["message"].startswith(f"Model '{EMBED_MODEL}' does not support Matryoshka "
                                       "embeddings; dimensions must be unset (received "
                                       "dimensions=8).")


def test_too_long_input_names_operation_and_counts(ehttp):
    error = error_of(ehttp.post("/v1/embeddings", json={"input": "word " * 300}))
    assert error["param"] == "input_tokens"
    assert error["message"].startswith(
        "This model's maximum context length is 256 tokens. However, you requested 302 tokens "
        "in the input for embedding generation. Please reduce the length of the input.")
    ok = ehttp.post("/v1/embeddings", json={"input": "word " * 300, "truncate_prompt_tokens": 256})
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == 256
    error = error_of(ehttp.post("/score", json={"text_1": "word " * 300, "text_2": "x"}))
    assert "tokens in the input for score." in error["message"]


def test_removed_normalize_and_schema_errors_are_400(ehttp):
    error = error_of(ehttp.post("/v1/embeddings", json={"input": "x", "normalize": True}))
    assert error["param"] == "normalize"
    assert error["message"].startswith("Parameter `normalize` was removed; use `use_activation` "
                                       "instead.")
    assert ehttp.post("/v1/embeddings", json={"input": [1.5]}).status_code == 400
    assert ehttp.post("/v1/embeddings", content=b"x").status_code == 400


def test_metrics_count_pooling_prompt_tokens(ehttp):
    def prompt_tokens() -> float:
        for line in ehttp.get("/metrics").text.splitlines():
            if line.startswith("vllm:prompt_tokens_total{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = prompt_tokens()
    usage = ehttp.post("/v1/embeddings", json={"input": SENTENCES}).json()["usage"]
    assert prompt_tokens() - before == usage["prompt_tokens"]


# -- routes by model kind ---------------------------------------------------------------------
def test_embedding_model_routes(ehttp):
    assert ehttp.get("/v1/models").json()["data"][0]["id"] == EMBED_MODEL
    for path in ("/v1/completions", "/v1/chat/completions", "/classify"):
        assert ehttp.post(path, json={"prompt": "x"}).status_code == 404, path
    assert ehttp.post("/pooling", json={"input": "x"}).status_code == 200


def test_generative_model_routes(http):
    assert http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1}).status_code == 200
    paths = {r["path"] if isinstance(r, dict) else r for r in http.get("/openapi.json").json()[
        "paths"]}
    assert {"/classify", "/score", "/rerank", "/v2/rerank", "/v1/embeddings", "/pooling"} <= paths


# -- /pooling ---------------------------------------------------------------------------------
def test_pooling_embed_equals_embeddings_and_encode_is_unnormalized(ehttp):
    pooled = ehttp.post("/pooling", json={"input": SENTENCES[0]}).json()
    assert pooled["id"].startswith("pool-") and pooled["data"][0]["object"] == "pooling"
    embedded = ehttp.post("/v1/embeddings", json={"input": SENTENCES[0]}).json()
    assert pooled["data"][0]["data"] == embedded["data"][0]["embedding"]
    raw = np.array(ehttp.post("/pooling", json={"input": SENTENCES[0],
                                                "task": "encode"}).json()["data"][0]["data"])
    assert np.linalg.norm(raw) > 1.5
    assert np.allclose(raw / np.linalg.norm(raw), pooled["data"][0]["data"], atol=1e-6)
    error = error_of(ehttp.post("/pooling", json={"input": "x", "task": "classify"}))
    assert error["message"].startswith("Unsupported task: 'classify' Supported tasks: "
                                       "('embed', 'score', 'encode')")


# -- /score and /rerank (bi-encoder) ----------------------------------------------------------
def test_score_is_cosine_of_embeddings(ehttp):
    emb = np.array([d["embedding"] for d in ehttp.post(
        "/v1/embeddings", json={"input": SENTENCES}).json()["data"]])
    one_to_many = ehttp.post("/score", json={"queries": SENTENCES[0], "documents": SENTENCES})
    scores = [d["score"] for d in one_to_many.json()["data"]]
    assert scores == pytest.approx((emb @ emb[0]).tolist(), abs=1e-5)
    many = ehttp.post("/score", json={"text_1": SENTENCES[:2], "text_2": SENTENCES[1:]}).json()
    assert [d["score"] for d in many["data"]] == pytest.approx(
        [float(emb[0] @ emb[1]), float(emb[1] @ emb[2])], abs=1e-5)
    error = error_of(ehttp.post("/score", json={"text_1": SENTENCES[:2], "text_2": SENTENCES}))
    assert error["message"] == "Input lengths must be either 1:1, 1:N or N:N (parameter=text_2)"


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_best_first_with_top_n(ehttp, path):
    docs = [SENTENCES[2], SENTENCES[1], SENTENCES[0]]
    body = ehttp.post(path, json={"query": SENTENCES[0], "documents": docs, "top_n": 2}).json()
    assert [r["index"] for r in body["results"]] == [2, 1]
    assert body["results"][0]["document"] == {"text": SENTENCES[0], "multi_modal": None}
    assert body["results"][0]["relevance_score"] == pytest.approx(1.0, abs=1e-5)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    assert set(body) == {"id", "model", "usage", "results"}


def test_rerank_is_stable_across_calls(ehttp):
    """Same order every call. Documents 0 and 3 are the same text: their scores agree to float
    noise (batch composition may move the last bits), so their relative order is not fixed."""
    body = {"query": "pets", "documents": SENTENCES + SENTENCES[:1]}
    first = ehttp.post("/rerank", json=body).json()["results"]
    again = ehttp.post("/rerank", json=body).json()["results"]

    def order(results):
        return [r["index"] for r in results if r["index"] != 3]

    assert order(first) == order(again)
    scores = {r["index"]: r["relevance_score"] for r in first}
    assert scores[0] == pytest.approx(scores[3], abs=1e-5)


def test_per_side_token_limits_score_the_first_tokens(ehttp):
    """`max_tokens_per_query` / `max_tokens_per_doc` keep the first N tokens of each side: the
    scores equal those of the cut texts, and documents are echoed whole."""
    query, doc = "a cat sleeps on the warm mat all day long", "the dog barks at the mailman"
    cut = ehttp.post("/score", json={"queries": query, "documents": doc,
                                     "max_tokens_per_query": 2, "max_tokens_per_doc": 2}).json()
    by_hand = ehttp.post("/score", json={"queries": "a cat", "documents": "the dog"}).json()
    whole = ehttp.post("/score", json={"queries": query, "documents": doc}).json()
    assert cut["data"][0]["score"] == pytest.approx(by_hand["data"][0]["score"], abs=1e-5)
    assert cut["data"][0]["score"] != pytest.approx(whole["data"][0]["score"], abs=1e-3)
    assert cut["usage"]["prompt_tokens"] < whole["usage"]["prompt_tokens"]
    ranked = ehttp.post("/rerank", json={"query": query, "documents": [doc],
                                         "max_tokens_per_doc": 2}).json()
    assert ranked["results"][0]["document"]["text"] == doc
    assert ranked["results"][0]["relevance_score"] == pytest.approx(
        ehttp.post("/score", json={"queries": query, "documents": "the dog"}).json()
        ["data"][0]["score"], abs=1e-5)
    error = error_of(ehttp.post("/score", json={"queries": query, "documents": doc,
                                                "max_tokens_per_doc": -1}))
    assert error["param"] == "body.max_tokens_per_doc" and "greater than or equal to 0" in error["message"]


# -- the generative model (label tokens) ------------------------------------------------------
@pytest.mark.slow
def test_generative_classify_score_rerank_agree(http):
    body = http.post("/classify", json={"input": ["Is the sky blue?", "Is fire cold?"]}).json()
    assert body["id"].startswith("classify-")
    for item in body["data"]:
        assert item["num_classes"] == 2 and sum(item["probs"]) == pytest.approx(1.0, abs=1e-5)
        assert item["label"] == ("yes" if item["probs"][1] > item["probs"][0] else "no")
    query = "What is the capital of France?"
    docs = ["Bananas are yellow fruit.", "Paris is the capital of France."]
    scores = [d["score"] for d in http.post("/score", json={"queries": query,
                                                             "documents": docs}).json()["data"]]
    assert all(0 < s < 1 for s in scores)
    ranked = http.post("/rerank", json={"query": query, "documents": docs}).json()["results"]
    assert [r["relevance_score"] for r in ranked] == pytest.approx(sorted(scores, reverse=True),
                                                                   abs=1e-5)
    raw = [d["score"] for d in http.post("/score", json={
        "queries": query, "documents": docs, "use_activation": False}).json()["data"]]
    assert [1 / (1 + np.exp(-r)) for r in raw] == pytest.approx(scores, abs=1e-5)  # log-odds


@pytest.mark.slow
def test_generative_embeddings_from_chat_messages(http, client):
    messages = [{"role": "user", "content": "Hello there"}]
    body = http.post("/v1/embeddings", json={"messages": messages}).json()
    rendered = http.post("/tokenize", json={"messages": messages,
                                            "add_generation_prompt": False}).json()
    assert body["usage"]["prompt_tokens"] == rendered["count"]
    vec = np.array(body["data"][0]["embedding"])
    assert np.linalg.norm(vec) == pytest.approx(1.0, abs=1e-5)
