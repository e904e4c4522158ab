"""The pooling pipeline (embeddings, pooling, classify, score, rerank) over a fake engine.

`FakePoolingEngine` speaks the `AsyncLLMEngine.encode` interface: an "embedding" is a
deterministic bag of token ids, so tests check the serving layer's own work (inputs, stages,
errors, encodings, pairing, ranking) in milliseconds.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from workbench.config import EngineConfig
from workbench.engine.requests.outputs import PoolingOutput, PoolingRequestOutput
from workbench.errors import ValidationError
from workbench.serving import RequestMeta, ServerConfig, Servings, error_response
from workbench.serving.errors import GenerationError
from workbench.serving.pooling.base import MISSING_RESULTS, NO_GENERATOR, NO_PROMPTS
from workbench.serving.protocol import ErrorResponse
from workbench.serving.protocol.pooling import (
    ClassificationCompletionRequest,
    EmbeddingChatRequest,
    EmbeddingCompletionRequest,
    PoolingCompletionRequest,
    RerankRequest,
    ScoreRequest,
)

DIM = 16


def bag(ids: list[int]) -> torch.Tensor:
    vec = torch.zeros(DIM)
    for t in ids:
        vec[t % DIM] += 1.0 + (t % 7) / 10
    return vec


@dataclass
class FakePoolingEngine:
    tokenizer: object
    max_model_len: int = 32
    served_model_name: str = "fake-pool"
    model_path: str = "/models/fake-pool"
    is_pooling_model: bool = True
    pooling_tasks: tuple = ("embed", "score", "encode")
    classifier_labels: tuple = ("no", "yes")
    finish_reason: str = "stop"  # what every request ends with ("abort", "error")
    generation_defaults: dict = field(default_factory=dict)
    config: EngineConfig = field(default_factory=lambda: EngineConfig(model="fake"))
    submitted: list = field(default_factory=list)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def check_health(self) -> None:
        pass

    async def encode(self, prompt, params, request_id, priority=0):
        ids = prompt["prompt_token_ids"]
        self.submitted.append((request_id, ids, params))
        await asyncio.sleep(0)
        if self.finish_reason != "stop":
            data = torch.empty(0)
        elif params.task in ("embed", "encode"):
            vec = bag(ids)
            data = vec / vec.norm() if params.use_activation is not False else vec
        elif params.task == "classify":
            logits = torch.tensor([float(len(ids) % 3), 1.0])
            data = torch.softmax(logits, -1) if params.use_activation is not False else logits
        else:  # score: a number that grows with the prompt length
            data = torch.tensor([1 - 1 / len(ids)])
        yield PoolingRequestOutput(request_id, PoolingOutput(data), ids,
                                   finish_reason=self.finish_reason)

    async def abort(self, request_id: str) -> None:
        pass


@pytest.fixture
def engine(tokenizer):
    return FakePoolingEngine(tokenizer)


@pytest.fixture
def generative(tokenizer):
    return FakePoolingEngine(tokenizer, max_model_len=4096, is_pooling_model=False,
                             pooling_tasks=("classify", "score", "embed", "encode"))


def servings(engine, **config):
    return Servings.build(engine, ServerConfig(**config))


def run(coro):
    return asyncio.run(coro)


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=True).input_ids


# -- /v1/embeddings ---------------------------------------------------------------------------
def test_embeddings_of_texts_and_token_ids_in_input_order(engine, tokenizer):
    s = servings(engine).embeddings
    texts = ["hello world", "a cat", "the end"]
    out = run(s.create(EmbeddingCompletionRequest(input=texts)))
    assert out.object == "list" and out.id.startswith("embd-") and out.model == "fake-pool"
    assert [d.index for d in out.data] == [0, 1, 2]
    assert all(d.object == "embedding" for d in out.data)
    ids = ids_of(tokenizer, "a cat")
    assert out.data[1].embedding == pytest.approx((bag(ids) / bag(ids).norm()).tolist())
    n = sum(len(ids_of(tokenizer, t)) for t in texts)
    assert (out.usage.prompt_tokens, out.usage.total_tokens, out.usage.completion_tokens) == (n, n, 0)
    by_ids = run(s.create(EmbeddingCompletionRequest(input=[ids_of(tokenizer, t) for t in texts])))
    assert [d.embedding for d in by_ids.data] == [d.embedding for d in out.data]


def test_embedding_of_one_text_and_one_id_list(engine, tokenizer):
    s = servings(engine).embeddings
    assert len(run(s.create(EmbeddingCompletionRequest(input="hi"))).data) == 1
    assert len(run(s.create(EmbeddingCompletionRequest(input=[5, 6, 7]))).data) == 1
    assert len(run(s.create(EmbeddingCompletionRequest(input=[[5, 6], [7]]))).data) == 2


def test_base64_decodes_to_the_same_float32_values(engine):
    s = servings(engine).embeddings
    floats = run(s.create(EmbeddingCompletionRequest(input=["one", "two"])))
    b64 = run(s.create(EmbeddingCompletionRequest(input=["one", "two"], encoding_format="base64")))
    for f, b in zip(floats.data, b64.data):
        decoded = np.frombuffer(base64.b64decode(b.embedding), dtype="float32")  # as openai does
        assert decoded.tolist() == f.embedding


def test_base64_big_endian_and_float16(engine):
    s = servings(engine).embeddings
    ref = run(s.create(EmbeddingCompletionRequest(input="x"))).data[0].embedding
    big = run(s.create(EmbeddingCompletionRequest(input="x", encoding_format="base64",
                                                  endianness="big"))).data[0].embedding
    assert np.frombuffer(base64.b64decode(big), dtype=">f4").tolist() == ref
    half = run(s.create(EmbeddingCompletionRequest(input="x", encoding_format="base64",
                                                   embed_dtype="float16"))).data[0].embedding
    assert np.frombuffer(base64.b64decode(half), dtype="<f2").astype("float32") == \
        pytest.approx(ref, abs=1e-3)
    for dtype in ("bfloat16", "fp8_e4m3", "fp8_e5m2"):
        raw = run(s.create(EmbeddingCompletionRequest(input="x", encoding_format="base64",
                                                      embed_dtype=dtype))).data[0].embedding
        torch_dtype = {"bfloat16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn,
                       "fp8_e5m2": torch.float8_e5m2}[dtype]
        width = torch.tensor([], dtype=torch_dtype).element_size()
        decoded = torch.frombuffer(bytearray(base64.b64decode(raw)), dtype=torch_dtype)
        assert len(decoded) * width == len(base64.b64decode(raw)) and len(decoded) == len(ref)
        assert decoded.float().tolist() == torch.tensor(ref).to(torch_dtype).float().tolist()


def test_chat_messages_are_rendered_without_generation_prompt(engine, tokenizer):
    s = servings(engine).embeddings
    messages = [{"role": "user", "content": "Hi there"}]
    run(s.create(EmbeddingChatRequest(messages=messages)))
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert engine.submitted[-1][1] == tokenizer(text, add_special_tokens=False).input_ids


def test_use_activation_false_gives_the_raw_vector(engine, tokenizer):
    s = servings(engine).embeddings
    out = run(s.create(EmbeddingCompletionRequest(input=[3, 4, 3], use_activation=False)))
    assert out.data[0].embedding == pytest.approx(bag([3, 4, 3]).tolist())


def test_too_long_input_names_the_operation_and_counts(engine):
    s = servings(engine)
    long = [5] * 40
    cases = [(s.embeddings, EmbeddingCompletionRequest(input=long), "embedding generation"),
             (s.score, ScoreRequest(text_1=[5] * 0 or "x " * 40, text_2="y"), "score"),
             (s.rerank, RerankRequest(query="x " * 40, documents=["y"]), "embedding generation")]
    for serving, request, operation in cases:
        with pytest.raises(ValidationError) as info:
            run(serving.create(request))
        assert info.value.parameter == "input_tokens"
        assert "This model's maximum context length is 32 tokens. However, you requested" in \
            info.value.message
        assert f"tokens in the input for {operation}. Please reduce the length of the input." \
            in info.value.message
    exactly = run(s.embeddings.create(EmbeddingCompletionRequest(input=[5] * 32)))
    assert exactly.usage.prompt_tokens == 32  # the whole context is allowed


def test_classification_names_its_operation(generative):
    s = servings(generative, ).classify
    s.max_model_len = s.pooling_prompts.max_model_len = 8
    with pytest.raises(ValidationError, match="in the input for classification"):
        run(s.create(ClassificationCompletionRequest(input=[5] * 9)))


def test_truncate_prompt_tokens(engine):
    s = servings(engine).embeddings
    run(s.create(EmbeddingCompletionRequest(input=list(range(1, 41)), truncate_prompt_tokens=5,
                                            truncation_side="left")))
    assert engine.submitted[-1][1] == [36, 37, 38, 39, 40]
    run(s.create(EmbeddingCompletionRequest(input=list(range(1, 41)), truncate_prompt_tokens=5,
                                            truncation_side="right")))
    assert engine.submitted[-1][1] == [1, 2, 3, 4, 5]
    run(s.create(EmbeddingCompletionRequest(input=list(range(1, 41)), truncate_prompt_tokens=-1)))
    assert len(engine.submitted[-1][1]) == 32
    with pytest.raises(ValidationError, match="truncate_prompt_tokens value is greater than "
                       "max_model_len. Please request a smaller truncation size."):
        run(s.create(EmbeddingCompletionRequest(input="x", truncate_prompt_tokens=33)))


@pytest.mark.parametrize("body, param, message", [
    ({"input": "x", "normalize": True}, "normalize",
     "Parameter `normalize` was removed; use `use_activation` instead."),
    ({"input": "x", "cache_salt": "s"}, "cache_salt", "`cache_salt` is not supported"),
    ({"input": "x", "encoding_format": "bytes"}, "encoding_format", "encoding_format 'bytes'"),
    ({"input": []}, "input", "Input cannot be empty"),
    ({"input": [999999]}, "input", "Token id 999999 is out of vocabulary"),
])
def test_refusals_name_the_parameter(engine, body, param, message):
    """Checks on the raw body answer as the HTTP layer does; the rest from the pipeline."""
    import pydantic

    from workbench.serving.errors import validation_error_body

    s = servings(engine).embeddings
    try:
        run(s.create(EmbeddingCompletionRequest(**body)))
    except pydantic.ValidationError as exc:
        err = ErrorResponse(**validation_error_body(list(exc.errors()))).error
    except Exception as exc:  # noqa: BLE001
        err = error_response(exc).error
    else:
        pytest.fail("not refused")
    assert (err.code, err.type, err.param) == (400, "BadRequestError", param)
    assert message in err.message


def test_unknown_model_is_404(engine):
    with pytest.raises(Exception) as info:
        run(servings(engine).embeddings.create(EmbeddingCompletionRequest(input="x", model="nope")))
    assert error_response(info.value).error.code == 404


# -- the stages' own errors -------------------------------------------------------------------
def test_preparing_generators_without_prompts(engine):
    s = servings(engine).embeddings
    ctx = s.context(EmbeddingCompletionRequest(input="x"))
    with pytest.raises(ValueError, match=f"^{NO_PROMPTS}$"):
        s.prepare_generators(ctx)
    with pytest.raises(ValueError, match=f"^{NO_PROMPTS}$"):
        run(s.collect(ctx))


def test_collecting_a_dry_run(engine):
    s = servings(engine).embeddings
    ctx = s.prepare(EmbeddingCompletionRequest(input=["x", "y"]), schedule=False)
    assert len(ctx.engine_prompts) == 2 and engine.submitted == []
    with pytest.raises(ValueError, match=f"^{NO_GENERATOR}$"):
        run(s.collect(ctx))


def test_aborted_requests_fail_the_batch(engine):
    engine.finish_reason = "abort"
    with pytest.raises(ValueError, match=f"^{MISSING_RESULTS}$") as info:
        run(servings(engine).embeddings.create(EmbeddingCompletionRequest(input=["x", "y"])))
    assert error_response(info.value).error.code == 400


def test_engine_error_is_a_500(engine):
    engine.finish_reason = "error"
    with pytest.raises(GenerationError) as info:
        run(servings(engine).embeddings.create(EmbeddingCompletionRequest(input="x")))
    assert error_response(info.value).error.code == 500


def test_recorder_lists_the_stages(engine):
    from workbench.serving.recorder import PipelineRecorder

    rec = PipelineRecorder()
    run(servings(engine).embeddings.create(EmbeddingCompletionRequest(input="x"),
                                           RequestMeta(recorder=rec)))
    names = [name for name, _, _ in rec.stages]
    assert names == ["check model", "validate", "preprocess", "pooling params",
                     "prepare generators", "collect batch", "build response"]
    assert all(c.status == "passed" for c in rec.checks if c.stage != "validate")


# -- /pooling ---------------------------------------------------------------------------------
def test_pooling_default_task_and_unsupported_task(engine):
    s = servings(engine).pooling
    out = run(s.create(PoolingCompletionRequest(input=[3, 4])))
    assert out.id.startswith("pool-") and out.data[0].object == "pooling"
    assert out.data[0].data == pytest.approx((bag([3, 4]) / bag([3, 4]).norm()).tolist())
    assert engine.submitted[-1][2].task == "embed"
    with pytest.raises(ValueError) as info:
        run(s.create(PoolingCompletionRequest(input="x", task="classify")))
    assert str(info.value) == ("Unsupported task: 'classify' Supported tasks: "
                               "('embed', 'score', 'encode')")


# -- /classify --------------------------------------------------------------------------------
def test_classify_labels_and_probabilities(generative):
    s = servings(generative).classify
    out = run(s.create(ClassificationCompletionRequest(input=[[5], [5, 6, 7, 8, 9]])))
    assert out.id.startswith("classify-")
    first, second = out.data
    assert first.num_classes == 2 and sum(first.probs) == pytest.approx(1.0)
    assert first.label == "no" if first.probs[0] > first.probs[1] else "yes"
    assert second.label == ("no" if second.probs[0] > second.probs[1] else "yes")
    raw = run(s.create(ClassificationCompletionRequest(input=[5], use_activation=False)))
    assert raw.data[0].probs == [1.0, 1.0]


def test_classify_on_an_embedding_model_is_refused(engine):
    with pytest.raises(ValueError, match="Unsupported task: 'classify'"):
        run(servings(engine).classify.create(ClassificationCompletionRequest(input="x")))


# -- /score -----------------------------------------------------------------------------------
def cos(a, b):
    return float(torch.nn.functional.cosine_similarity(bag(a), bag(b), dim=0))


def test_score_is_cosine_of_embeddings_one_to_many(engine, tokenizer):
    s = servings(engine).score
    out = run(s.create(ScoreRequest(queries="cats purr", documents=["dogs bark", "cats purr"])))
    q = ids_of(tokenizer, "cats purr")
    expected = [cos(q, ids_of(tokenizer, "dogs bark")), cos(q, q)]
    assert [d.score for d in out.data] == pytest.approx(expected, abs=1e-6)
    assert out.data[1].score == pytest.approx(1.0)
    assert [d.object for d in out.data] == ["score", "score"]
    assert out.usage.prompt_tokens == 3 * len(q) + len(ids_of(tokenizer, "dogs bark"))


@pytest.mark.parametrize("names", [("queries", "documents"), ("queries", "items"),
                                   ("data_1", "data_2"), ("text_1", "text_2")])
def test_score_field_pairs_many_to_many(engine, names):
    s = servings(engine).score
    out = run(s.create(ScoreRequest(**{names[0]: ["a", "b"], names[1]: ["a", "c"]})))
    assert len(out.data) == 2 and out.data[0].score == pytest.approx(1.0)


@pytest.mark.parametrize("body, message", [
    ({"text_1": ["a", "b"], "text_2": ["a", "b", "c"]},
     "Input lengths must be either 1:1, 1:N or N:N"),
    ({"text_1": [], "text_2": ["a"]}, "At least one text element must be given"),
    ({"text_1": "a", "text_2": []}, "At least one text_pair element must be given"),
])
def test_score_cardinality_messages(engine, body, message):
    with pytest.raises(ValidationError, match=message):
        run(servings(engine).score.create(ScoreRequest(**body)))


def test_score_request_needs_one_pair_of_fields():
    with pytest.raises(Exception, match="needs its two sides"):
        ScoreRequest(model="m")
    with pytest.raises(Exception, match="were both set"):
        ScoreRequest(text_1="a", text_2="b", queries="a", documents="b")


def test_generative_score_uses_the_judgement_prompt(generative, tokenizer):
    from workbench.engine.step.pooling import judgement_prompt

    s = servings(generative).score
    out = run(s.create(ScoreRequest(queries="q", documents=["short", "a much longer document"])))
    submitted = generative.submitted[-2:]
    assert [p.task for _, _, p in submitted] == ["score", "score"]
    prompt = judgement_prompt("q", "short", tokenizer)
    assert submitted[0][1] == tokenizer(prompt, add_special_tokens=False).input_ids
    assert out.data[1].score > out.data[0].score


# -- /rerank ----------------------------------------------------------------------------------
def test_rerank_best_first_stable_top_n(engine):
    s = servings(engine).rerank
    docs = ["cats purr", "dogs bark", "cats purr", "cats purr loudly"]
    out = run(s.create(RerankRequest(query="cats purr", documents=docs)))
    assert out.id.startswith("rerank-")
    scores = [r.relevance_score for r in out.results]
    assert scores == sorted(scores, reverse=True)
    assert [r.index for r in out.results][:2] == [0, 2]  # equal scores keep document order
    assert [r.document.text for r in out.results] == [docs[r.index] for r in out.results]
    top = run(s.create(RerankRequest(query="cats purr", documents=docs, top_n=2)))
    assert [r.index for r in top.results] == [0, 2]
    bare = run(s.create(RerankRequest(query="cats purr", documents=docs, return_documents=False)))
    assert all(r.document is None for r in bare.results)
    assert out.usage.prompt_tokens == out.usage.total_tokens > 0


def test_rerank_needs_documents(engine):
    with pytest.raises(ValidationError, match="At least one text_pair element must be given"):
        run(servings(engine).rerank.create(RerankRequest(query="q", documents=[])))


def test_chat_in_input_and_batched_conversations(engine, tokenizer):
    from pydantic import TypeAdapter

    from workbench.serving.protocol.pooling import EmbeddingRequest

    s = servings(engine).embeddings
    one = [{"role": "user", "content": "Hi there"}]
    two = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Yo"}]
    parse = TypeAdapter(EmbeddingRequest).validate_python
    assert isinstance(parse({"input": one}), EmbeddingChatRequest)
    batched = run(s.create(parse({"messages": [one, two]})))
    in_input = run(s.create(parse({"input": [one, two]})))
    single = run(s.create(parse({"messages": two})))
    assert len(batched.data) == len(in_input.data) == 2
    assert batched.data[1].embedding == single.data[0].embedding
    assert [d.embedding for d in batched.data] == [d.embedding for d in in_input.data]
    text = tokenizer.apply_chat_template(two, tokenize=False, add_generation_prompt=False)
    assert single.usage.prompt_tokens == len(tokenizer(text, add_special_tokens=False).input_ids)
