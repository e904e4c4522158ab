"""The engine's encode path: embeddings, poolers, label classifier, scores, refusals, aborts.

References are plain transformers forwards on the same weights (float32): mean pooling with the
attention mask and L2 normalization for MiniLM (sentence-transformers' recipe), the final
hidden state and next-token logits of the last prompt token for SmolLM2.
"""

import asyncio
import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tests.engine.helpers import greedy, make_llm
from workbench.engine.async_engine import AsyncLLMEngine
from workbench.engine.requests.outputs import PoolingRequestOutput
from workbench.engine.step.encoder_runner import SUPPORTED_TYPES
from workbench.errors import EngineStepError, ValidationError
from workbench.llm import LLM
from workbench.models.registry import ENCODER_TYPES
from workbench.pooling_params import PoolingParams

SENTENCES = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest.",
    "Hi",
    "Embeddings map sentences to vectors so that similar meanings end up close together.",
    "Paris is the capital of France.",
]


@pytest.fixture(scope="module")
def minilm():
    from workbench.models import load_model

    return load_model("all-minilm-l6-v2", dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def enc(minilm):
    return LLM(minilm)


@pytest.fixture(scope="module")
def smol(default_model):
    return make_llm(default_model, max_model_len=512, num_kv_blocks=128)


@torch.inference_mode()
def hf_embedding(loaded, texts: list[str], pooling: str = "mean") -> torch.Tensor:
    """transformers' forward on a padded batch, then sentence-transformers' pooling."""
    enc = loaded.tokenizer(texts, padding=True, return_tensors="pt")
    hidden = loaded.model(**enc).last_hidden_state  # [B, L, H]
    mask = enc["attention_mask"].unsqueeze(-1).float()  # [B, L, 1]
    if pooling == "mean":
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "max":
        return hidden.masked_fill(mask == 0, float("-inf")).amax(1)
    lengths = enc["attention_mask"].sum(1)
    return hidden[torch.arange(len(texts)), lengths - 1]


@torch.inference_mode()
def hf_last_token(loaded, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(final hidden state [H], next-token logits [V]) of a prompt's last token."""
    ids = torch.tensor([loaded.tokenizer(text)["input_ids"]])
    hidden = loaded.model.model(input_ids=ids).last_hidden_state[0, -1]
    return hidden, loaded.model.lm_head(hidden).float()


def embeddings(outs) -> torch.Tensor:
    return torch.tensor([o.outputs.embedding for o in outs])


# -- the embedding model -----------------------------------------------------------------------
def test_embeddings_match_transformers_mean_pooling_and_normalization(enc, minilm):
    want = F.normalize(hf_embedding(minilm, SENTENCES), dim=-1)
    got = embeddings(enc.embed(SENTENCES))
    assert got.shape == (len(SENTENCES), 384)
    assert F.cosine_similarity(got, want, dim=-1).min() >= 0.9999
    torch.testing.assert_close(got.norm(dim=-1), torch.ones(len(SENTENCES)))


def test_embeddings_do_not_depend_on_the_batch(enc):
    batched = embeddings(enc.embed(SENTENCES))
    alone = torch.cat([embeddings(enc.embed([s])) for s in SENTENCES])
    reordered = embeddings(enc.embed(SENTENCES[::-1])).flip(0)
    assert F.cosine_similarity(batched, alone, dim=-1).min() >= 0.9999
    assert F.cosine_similarity(batched, reordered, dim=-1).min() >= 0.9999


def test_an_encoder_step_takes_whole_prompts_packed(enc):
    engine = enc.llm_engine
    seen = []
    real = engine.runner.execute

    def spy(out):
        seen.append([(s.num_tokens, len(s.seq.token_ids)) for s in out.scheduled])
        return real(out)

    engine.runner.execute = spy
    try:
        enc.embed(SENTENCES)
    finally:
        engine.runner.execute = real
    assert len(seen) == 1 and all(n == total for n, total in seen[0])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("pooling", ["cls", "last", "max"])
def test_other_poolers_match_transformers(pooling):
    from workbench.models import tiny_model

    loaded = dataclasses.replace(tiny_model("bert", seed=1), pooling=pooling)
    llm = LLM(loaded, max_model_len=128)
    got = embeddings(llm.embed(SENTENCES, PoolingParams(normalize=False)))
    want = hf_embedding(loaded, SENTENCES, pooling)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_encode_returns_the_raw_pooled_vector(enc, minilm):
    out = enc.encode(SENTENCES[:2], pooling_task="encode")
    assert isinstance(out[0], PoolingRequestOutput) and out[0].finish_reason == "stop"
    want = hf_embedding(minilm, SENTENCES[:2])
    torch.testing.assert_close(torch.stack([o.outputs.data for o in out]), want,
                               atol=1e-5, rtol=1e-4)


def test_score_is_the_cosine_of_the_embeddings(enc):
    docs = ["Paris is the capital of France.", "Bananas are yellow."]
    scores = enc.score("What is the capital of France?", docs)
    vecs = embeddings(enc.embed(["What is the capital of France?", *docs]))
    want = F.cosine_similarity(vecs[:1], vecs[1:], dim=-1)
    assert [s.outputs.score for s in scores] == pytest.approx(want.tolist(), abs=1e-5)
    assert scores[0].outputs.score > scores[1].outputs.score
    many = enc.score(["a cat", "a dog"], ["a kitten", "a puppy"])
    assert len(many) == 2 and all(-1 <= s.outputs.score <= 1 for s in many)


def test_the_whole_context_is_allowed_and_more_is_refused_with_counts(enc):
    engine = enc.llm_engine
    limit = engine.max_model_len
    assert limit == 256  # sentence-transformers' max_seq_length, not BERT's 512 positions
    assert len(enc.embed([[101] + [2023] * (limit - 2) + [102]])[0].outputs.embedding) == 384
    for task, operation in (("embed", "embedding generation"), ("score", "score")):
        with pytest.raises(ValidationError) as err:
            engine.add_pooling_request("long", [2023] * (limit + 1), PoolingParams(task=task))
        assert err.value.message == (
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{limit + 1} tokens in the input for {operation}. Please reduce the length of the "
            "input.")
        assert err.value.parameter == "input_tokens"
    assert not engine.has_unfinished_requests()


def test_truncation_keeps_the_last_tokens_up_to_the_whole_context(enc):
    engine = enc.llm_engine
    limit = engine.max_model_len
    out = enc.encode([[2023] * (limit + 50)], truncate_prompt_tokens=-1)[0]
    assert len(out.prompt_token_ids) == limit
    out = enc.encode([list(range(2000, 2020))], truncate_prompt_tokens=5)[0]
    assert out.prompt_token_ids == list(range(2015, 2020))
    with pytest.raises(ValidationError) as err:
        enc.embed(["hi"], truncate_prompt_tokens=limit + 1)
    assert err.value.parameter == "truncate_prompt_tokens"
    assert err.value.message == ("truncate_prompt_tokens value is greater than max_model_len. "
                                 "Please request a smaller truncation size.")


def test_dimensions_are_refused_on_this_model(enc):
    with pytest.raises(ValidationError) as err:
        enc.embed(["hi"], PoolingParams(dimensions=64))
    assert err.value.parameter == "dimensions" and "Matryoshka" in err.value.message
    assert len(enc.embed(["hi"], PoolingParams(dimensions=384))[0].outputs.embedding) == 384


def test_the_embedding_model_refuses_generation_and_classification(enc):
    engine = enc.llm_engine
    assert engine.is_pooling_model and engine.pooling_tasks == ("embed", "score", "encode")
    assert engine.classifier_labels == []
    with pytest.raises(ValidationError, match="is an embedding model: it cannot generate") as err:
        enc.generate(["Hello"], greedy(4))
    assert err.value.parameter == "model"
    from workbench.sampling_params import BeamSearchParams

    with pytest.raises(ValidationError, match="cannot generate"):
        enc.beam_search(["Hello"], BeamSearchParams(beam_width=2, max_tokens=4))
    with pytest.raises(ValidationError, match="Unsupported task: 'classify'"):
        enc.classify(["I loved it"])
    assert not engine.has_unfinished_requests()


def test_abort_frees_and_reports_abort(enc):
    engine = enc.llm_engine
    got = []
    engine.add_pooling_request("gone", "Some text", PoolingParams(), on_output=got.append)
    engine.abort_request("gone")
    engine.step()
    assert [(o.request_id, o.finish_reason, o.outputs.data.numel()) for o in got] == [
        ("gone", "abort", 0)]
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_model_failure_ends_the_request_with_error(enc, monkeypatch):
    engine = enc.llm_engine

    def broken(out):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine.runner, "execute", broken)
    got = []
    engine.add_pooling_request("bad", "Some text", PoolingParams(), on_output=got.append)
    engine.step()
    assert got[0].finish_reason == "error" and got[0].finished
    assert got[0].error == "RuntimeError: boom"
    with pytest.raises(EngineStepError, match="RuntimeError: boom"):
        enc.embed(["again"])
    monkeypatch.undo()
    assert len(enc.embed(["fine now"])[0].outputs.embedding) == 384


async def test_async_encode_yields_one_finished_output(enc):
    engine = AsyncLLMEngine.from_llm(enc)
    try:
        outs = [o async for o in engine.encode("Paris is the capital of France.",
                                               PoolingParams(), "e1")]
        assert len(outs) == 1 and outs[0].finished and outs[0].request_id == "e1"
        want = enc.embed(["Paris is the capital of France."])[0].outputs.embedding
        assert outs[0].outputs.data.tolist() == pytest.approx(want, abs=1e-6)
        with pytest.raises(ValidationError):
            async for _ in engine.encode("hi", PoolingParams(dimensions=3), "e2"):
                pass
        many = await asyncio.gather(*(_one(engine, s, f"m{i}") for i, s in enumerate(SENTENCES)))
        assert [o.request_id for o in many] == [f"m{i}" for i in range(len(SENTENCES))]
    finally:
        engine.shutdown()


async def _one(engine, text, rid):
    return [o async for o in engine.encode(text, PoolingParams(), rid)][-1]


async def test_cancelling_encode_aborts_and_frees(enc, monkeypatch):
    engine = AsyncLLMEngine.from_llm(enc)
    inner = enc.llm_engine
    real, started = inner.runner.execute, asyncio.Event()
    loop = asyncio.get_running_loop()
    import threading

    release = threading.Event()

    def held(out):  # the step waits until the test has cancelled its consumer
        loop.call_soon_threadsafe(started.set)
        release.wait(5)
        return real(out)

    monkeypatch.setattr(inner.runner, "execute", held)
    try:
        task = asyncio.create_task(_one(engine, "to be cancelled", "c1"))
        await asyncio.wait_for(started.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        for _ in range(500):
            if not inner.has_unfinished_requests():
                break
            await asyncio.sleep(0.01)
        assert not inner.has_unfinished_requests()
        assert inner.block_manager.num_free_blocks == inner.block_manager.num_blocks
    finally:
        release.set()
        engine.shutdown()


# -- a generative model (label tokens, last-token embeddings) ------------------------------------
def test_generative_model_tasks_and_labels(smol):
    engine = smol.llm_engine
    assert not engine.is_pooling_model
    assert engine.pooling_tasks == ("classify", "score", "embed", "encode")
    assert engine.classifier_labels == ["no", "yes"]


def test_classify_is_the_softmax_of_the_label_token_logits(smol, default_model):
    tok = default_model.tokenizer
    label_ids = [tok("no", add_special_tokens=False)["input_ids"][0],
                 tok("yes", add_special_tokens=False)["input_ids"][0]]
    texts = ["I loved it", "Is the sky blue? Answer yes or no:"]
    got = smol.classify(texts)
    for text, out in zip(texts, got):
        _, logits = hf_last_token(default_model, text)
        want = torch.softmax(logits[label_ids], -1)
        assert out.outputs.probs == pytest.approx(want.tolist(), abs=1e-4)
    raw = smol.classify(texts[:1], PoolingParams(use_activation=False))[0].outputs.probs
    _, logits = hf_last_token(default_model, texts[0])
    assert raw == pytest.approx(logits[label_ids].tolist(), abs=1e-3)


def test_generative_embeddings_are_the_normalized_last_hidden_state(smol, default_model):
    text = "Paris is the capital of France."
    hidden, _ = hf_last_token(default_model, text)
    got = torch.tensor(smol.embed([text])[0].outputs.embedding)
    assert F.cosine_similarity(got, hidden, dim=0) >= 0.9999
    assert got.norm().item() == pytest.approx(1.0, abs=1e-5)


def test_pooling_beside_generation_gives_the_same_results(smol):
    engine = smol.llm_engine
    texts = ["Paris is the capital of France.", "I loved it"]
    alone = [smol.embed([t])[0].outputs.embedding for t in texts]
    probs_alone = smol.classify(texts)[1].outputs.probs
    got, gen = {}, []
    engine.add_request("g1", "Once upon a time", greedy(12), on_output=gen.append)
    engine.step()  # the generation is decoding when the pooling requests arrive
    engine.add_request("g2", "Tell me a long story about a dragon", greedy(8),
                       on_output=gen.append)
    for i, t in enumerate(texts):
        engine.add_pooling_request(f"e{i}", t, PoolingParams(task="embed"),
                                   on_output=lambda o: got.__setitem__(o.request_id, o))
    engine.add_pooling_request("c", texts[1], PoolingParams(task="classify"),
                               on_output=lambda o: got.__setitem__(o.request_id, o))
    while engine.has_unfinished_requests():
        engine.step()
    for i in range(len(texts)):
        sim = F.cosine_similarity(got[f"e{i}"].outputs.data, torch.tensor(alone[i]), dim=0)
        assert sim >= 0.9999
    assert got["c"].outputs.data.tolist() == pytest.approx(probs_alone, abs=1e-4)
    assert any(o.finished for o in gen)


def test_pooling_works_across_prefill_chunks_and_prefix_cache(default_model):
    llm = make_llm(default_model, max_model_len=512, num_kv_blocks=128,
                   max_num_batched_tokens=16)
    text = "In a quiet village by the sea, the fishermen mended their nets every morning " * 3
    first = llm.encode([text], pooling_task="embed")[0]
    again = llm.encode([text], pooling_task="embed")[0]
    hidden, _ = hf_last_token(default_model, text)
    assert F.cosine_similarity(first.outputs.data, hidden, dim=0) >= 0.9999
    assert again.num_cached_tokens > 0
    assert F.cosine_similarity(first.outputs.data, again.outputs.data, dim=0) >= 0.9999
    bm = llm.llm_engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # pooled requests hold no block once finished


def test_generative_score_is_the_yes_probability_of_the_judgement_prompt(smol, default_model):
    from workbench.engine.step.pooling import judgement_prompt

    docs = ["Paris is the capital of France.", "Bananas are yellow."]
    scores = smol.score("What is the capital of France?", docs)
    probs = smol.classify([judgement_prompt("What is the capital of France?", d,
                                            default_model.tokenizer) for d in docs])
    assert [s.outputs.score for s in scores] == pytest.approx(
        [p.outputs.probs[1] for p in probs], abs=1e-5)
    assert scores[0].outputs.score > scores[1].outputs.score


def test_long_inputs_are_refused_naming_classification(smol):
    engine = smol.llm_engine
    limit = engine.max_model_len
    with pytest.raises(ValidationError, match=f"However, you requested {limit + 1} tokens in the "
                       "input for classification"):
        engine.add_pooling_request("x", [1] * (limit + 1), PoolingParams())
    out = smol.classify([[1] * limit])[0]  # the whole context is fine: nothing is generated
    assert len(out.outputs.probs) == 2


def test_classifier_labels_are_configurable_and_checked(tiny_llama):
    llm = make_llm(tiny_llama, classifier_labels=("no", "yes", "maybe"))
    assert llm.llm_engine.classifier_labels == ["no", "yes", "maybe"]
    probs = llm.classify(["I loved it"])[0].outputs.probs
    assert len(probs) == 3 and sum(probs) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValidationError, match="must be exactly one token") as err:
        make_llm(tiny_llama, classifier_labels=("no", "antidisestablishmentarianism"))
    assert err.value.parameter == "classifier_labels"
    with pytest.raises(ValidationError) as err:
        make_llm(tiny_llama, classifier_labels=("yes",))
    assert err.value.parameter == "classifier_labels"


def test_cache_salt_separates_prefix_caches_and_prompt_embeds_are_refused(smol):
    engine = smol.llm_engine
    text = "A salted prompt that is long enough to fill a couple of KV cache blocks, surely."
    got = []
    for rid, salt in (("s1", "alice"), ("s2", "bob"), ("s3", "alice")):
        engine.add_pooling_request(rid, text, PoolingParams(task="embed"), cache_salt=salt,
                                   on_output=got.append)
        while engine.has_unfinished_requests():
            engine.step()
    assert [o.num_cached_tokens > 0 for o in got] == [False, False, True]
    with pytest.raises(ValidationError) as err:
        engine.add_pooling_request("pe", {"prompt": "x", "prompt_embeds": torch.zeros(2, 576)},
                                   PoolingParams())
    assert err.value.parameter == "prompt_embeds"


def test_bf16_encoder_is_prepacked_and_agrees_with_transformers():
    from workbench.engine.step.fusion import FastLinear, can_prepack
    from workbench.models import tiny_model

    llm = LLM(tiny_model("bert", seed=2, dtype="bfloat16"), max_model_len=128)
    layer = llm.llm_engine.model.encoder.layer[0]
    if can_prepack(next(llm.llm_engine.model.parameters())):
        assert isinstance(layer.attention.self.query, FastLinear)
    got = embeddings(llm.embed(SENTENCES))
    want = F.normalize(hf_embedding(tiny_model("bert", seed=2, dtype="bfloat16"),
                                    SENTENCES).float(), dim=-1)
    assert F.cosine_similarity(got, want, dim=-1).min() >= 0.999


def _tiny_encoder(config, tokenizer):
    from transformers import AutoModel

    from workbench.models.loader import LoadedModel, prepare_for_inference

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = prepare_for_inference(AutoModel.from_config(config), "cpu")
    return LoadedModel(model=net, tokenizer=tokenizer, config=net.config, path=None,
                       served_name=config.model_type, kind="embed", dtype=torch.float32,
                       device="cpu", pooling="mean", normalize=True)


def test_roberta_positions_start_after_the_padding_id():
    from transformers import RobertaConfig

    from workbench.models import tiny_model

    tok = tiny_model("bert").tokenizer
    config = RobertaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=66, pad_token_id=tok.pad_token_id)
    loaded = _tiny_encoder(config, tok)
    llm = LLM(loaded)
    assert llm.llm_engine.max_model_len == 66 - (tok.pad_token_id + 1)
    got = embeddings(llm.embed(SENTENCES))
    want = F.normalize(hf_embedding(_tiny_encoder(config, tok), SENTENCES), dim=-1)
    assert F.cosine_similarity(got, want, dim=-1).min() >= 0.9999


def test_an_encoder_of_another_layout_is_refused_at_start_up():
    from transformers import DistilBertConfig

    from workbench.models import tiny_model

    tok = tiny_model("bert").tokenizer
    config = DistilBertConfig(vocab_size=len(tok), dim=64, hidden_dim=128, n_layers=1, n_heads=4)
    with pytest.raises(ValidationError, match="'distilbert' are not supported") as err:
        LLM(_tiny_encoder(config, tok))
    assert err.value.parameter == "model"


@pytest.mark.parametrize("model_type", ["xlm-roberta", "electra"])
def test_the_other_supported_encoders_match_transformers(model_type):
    """XLM-RoBERTa (RoBERTa's positions) and ELECTRA (embeddings projected to the hidden size)
    give transformers' own mean-pooled, normalized embeddings."""
    from transformers import AutoConfig

    from workbench.models import tiny_model

    tok = tiny_model("bert").tokenizer
    extra = dict(embedding_size=32) if model_type == "electra" else {}
    config = AutoConfig.for_model(model_type, vocab_size=len(tok), hidden_size=64,
                                  intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, max_position_embeddings=130,
                                  pad_token_id=tok.pad_token_id, **extra)
    got = embeddings(LLM(_tiny_encoder(config, tok)).embed(SENTENCES))
    want = F.normalize(hf_embedding(_tiny_encoder(config, tok), SENTENCES), dim=-1)
    assert F.cosine_similarity(got, want, dim=-1).min() >= 0.9999


@pytest.mark.parametrize("model_type", sorted(ENCODER_TYPES - SUPPORTED_TYPES))
def test_every_other_encoder_type_is_refused_by_name(model_type):
    from workbench.models import tiny_model

    loaded = tiny_model("bert")
    loaded = dataclasses.replace(loaded, model=copy.deepcopy(loaded.model))
    loaded.model.config.model_type = model_type
    with pytest.raises(ValidationError, match=f"'{model_type}' are not supported"):
        LLM(loaded)
