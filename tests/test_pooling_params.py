"""PoolingParams validation and the model-free pooling math (engine/step/pooling.py)."""

import pytest
import torch

from workbench.engine.step import pooling
from workbench.errors import ValidationError
from workbench.pooling_params import PoolingParams

EMBED_TASKS = ("embed", "score", "encode")
LLM_TASKS = ("classify", "score", "embed", "encode")


@pytest.mark.parametrize("kwargs, parameter", [
    ({"task": "rerank"}, "task"),
    ({"dimensions": 1.5}, "dimensions"),
    ({"dimensions": True}, "dimensions"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"normalize": "yes"}, "normalize"),
    ({"use_activation": 1}, "use_activation"),
])
def test_bad_values_are_refused_by_name(kwargs, parameter):
    with pytest.raises(ValidationError) as err:
        PoolingParams(**kwargs)
    assert err.value.parameter == parameter


def test_the_default_task_is_the_models_first():
    assert PoolingParams().verify(EMBED_TASKS, "m", 384).task == "embed"
    assert PoolingParams().verify(LLM_TASKS, "m", 576).task == "classify"


def test_a_task_the_model_lacks_is_refused_with_the_supported_ones():
    with pytest.raises(ValidationError, match=r"Unsupported task: 'classify' Supported tasks: "
                       r"\('embed', 'score', 'encode'\)") as err:
        PoolingParams(task="classify").verify(EMBED_TASKS, "m", 384)
    assert err.value.parameter == "task"


def test_dimensions_other_than_the_full_size_are_refused():
    with pytest.raises(ValidationError) as err:
        PoolingParams(dimensions=128).verify(EMBED_TASKS, "all-minilm-l6-v2", 384)
    assert err.value.parameter == "dimensions"
    assert str(err.value).startswith(
        "Model 'all-minilm-l6-v2' does not support Matryoshka embeddings; dimensions must be "
        "unset (received dimensions=128).")
    assert PoolingParams(dimensions=384).verify(EMBED_TASKS, "m", 384).dimensions == 384


def test_dimensions_only_apply_to_embed():
    with pytest.raises(ValidationError) as err:
        PoolingParams(task="classify", dimensions=576).verify(LLM_TASKS, "m", 576)
    assert err.value.parameter == "dimensions"


def test_normalize_defaults_follow_the_task():
    assert PoolingParams().verify(EMBED_TASKS, "m", 8, default_normalize=True).normalize is True
    assert PoolingParams().verify(EMBED_TASKS, "m", 8, default_normalize=False).normalize is False
    assert PoolingParams(task="encode").verify(EMBED_TASKS, "m", 8).normalize is False
    assert PoolingParams(use_activation=False).verify(EMBED_TASKS, "m", 8).normalize is False
    assert PoolingParams(task="classify").verify(LLM_TASKS, "m", 8).use_activation is True


def test_normalize_is_refused_where_it_means_nothing_and_when_it_contradicts():
    with pytest.raises(ValidationError) as err:
        PoolingParams(task="classify", normalize=True).verify(LLM_TASKS, "m", 8)
    assert err.value.parameter == "normalize"
    with pytest.raises(ValidationError) as err:
        PoolingParams(normalize=True, use_activation=False).verify(EMBED_TASKS, "m", 8)
    assert err.value.parameter == "use_activation"


def test_verify_does_not_change_the_callers_params():
    params = PoolingParams()
    params.verify(EMBED_TASKS, "m", 8)
    assert params.task is None and params.normalize is None


# -- pooling math ----------------------------------------------------------------------------
def test_poolers_over_a_packed_row():
    torch.manual_seed(0)
    a, b = torch.randn(3, 4), torch.randn(5, 4)
    packed = torch.cat([a, b])
    torch.testing.assert_close(pooling.pool_segments(packed, [3, 5], "mean"),
                               torch.stack([a.mean(0), b.mean(0)]))
    torch.testing.assert_close(pooling.pool_segments(packed, [3, 5], "cls"), torch.stack([a[0], b[0]]))
    torch.testing.assert_close(pooling.pool_segments(packed, [3, 5], "last"),
                               torch.stack([a[-1], b[-1]]))
    torch.testing.assert_close(pooling.pool_segments(packed, [3, 5], "max"),
                               torch.stack([a.amax(0), b.amax(0)]))
    with pytest.raises(ValueError, match="Unknown pooling"):
        pooling.pool_segments(packed, [3, 5], "median")


def test_classify_is_the_softmax_of_the_label_logits():
    logits = torch.tensor([0.5, 2.0, -1.0, 3.0])
    params = PoolingParams(task="classify").verify(LLM_TASKS, "m", 4)
    probs = pooling.finish(params, torch.zeros(4), logits, [3, 1])
    torch.testing.assert_close(probs, torch.softmax(torch.tensor([3.0, 2.0]), -1))
    raw = PoolingParams(task="classify", use_activation=False).verify(LLM_TASKS, "m", 4)
    torch.testing.assert_close(pooling.finish(raw, torch.zeros(4), logits, [3, 1]),
                               torch.tensor([3.0, 2.0]))


def test_score_is_the_last_labels_probability_or_its_log_odds():
    logits = torch.tensor([1.0, 0.2, 0.0])
    params = PoolingParams(task="score").verify(LLM_TASKS, "m", 3)
    p_yes = pooling.finish(params, torch.zeros(3), logits, [0, 1])  # labels (no, yes)
    assert p_yes.shape == (1,)
    assert p_yes.item() == pytest.approx(torch.sigmoid(torch.tensor(0.2 - 1.0)).item())
    raw = PoolingParams(task="score", use_activation=False).verify(LLM_TASKS, "m", 3)
    assert pooling.finish(raw, torch.zeros(3), logits, [0, 1]).item() == pytest.approx(-0.8)


def test_embed_normalizes_unless_told_not_to():
    hidden = torch.tensor([3.0, 4.0])
    on = PoolingParams().verify(EMBED_TASKS, "m", 2)
    off = PoolingParams(normalize=False).verify(EMBED_TASKS, "m", 2)
    torch.testing.assert_close(pooling.finish(on, hidden, None, None), torch.tensor([0.6, 0.8]))
    torch.testing.assert_close(pooling.finish(off, hidden, None, None), hidden)


@pytest.mark.parametrize("one, two, pairs", [
    ("q", "d", [("q", "d")]),
    ("q", ["d1", "d2"], [("q", "d1"), ("q", "d2")]),
    (["q1", "q2"], ["d1", "d2"], [("q1", "d1"), ("q2", "d2")]),
])
def test_score_pairs_are_one_to_one_one_to_many_or_many_to_many(one, two, pairs):
    assert pooling.score_pairs(one, two) == pairs


def test_score_pairs_refuse_other_shapes():
    with pytest.raises(ValidationError, match="Input lengths must be either 1:1, 1:N or N:N"):
        pooling.score_pairs(["a", "b"], ["c", "d", "e"])
    with pytest.raises(ValidationError, match="At least one text element must be given"):
        pooling.score_pairs([], ["d"])
    with pytest.raises(ValidationError, match="At least one text_pair element must be given"):
        pooling.score_pairs("q", [])


def test_labels_must_be_single_tokens(tokenizer):
    assert len(pooling.label_token_ids(tokenizer, ("no", "yes"))) == 2
    with pytest.raises(ValidationError, match="must be exactly one token") as err:
        pooling.label_token_ids(tokenizer, ("no", "antidisestablishmentarianism"))
    assert err.value.parameter == "classifier_labels"


def test_the_judgement_prompt_holds_query_and_document(tokenizer):
    text = pooling.judgement_prompt("capital of France?", "Paris is the capital.", tokenizer)
    assert "<Query>: capital of France?" in text and "<Document>: Paris is the capital." in text
    assert text.endswith("<|im_start|>assistant\n")  # the model answers next: yes or no
    plain = pooling.judgement_prompt("q", "d")
    assert plain.endswith("Answer (yes or no):")
