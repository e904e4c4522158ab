"""Output building pieces without a model: a position's logprob entry."""

from workbench.engine.requests.output_processor import position_logprobs


def texts(token_id: int) -> str:
    return f"<{token_id}>"


def test_the_chosen_token_comes_first_then_the_top_k():
    entry = position_logprobs(9, -3.0, 4, [1, 2, 3], [-0.1, -0.5, -1.0], 2, texts)
    assert list(entry) == [9, 1, 2]
    assert (entry[9].rank, entry[1].rank, entry[2].rank) == (4, 1, 2)
    assert entry[2].logprob == -0.5 and entry[9].decoded_token == "<9>"


def test_a_chosen_token_inside_the_top_k_is_listed_once():
    entry = position_logprobs(2, -0.5, 2, [1, 2, 3], [-0.1, -0.5, -1.0], 3, texts)
    assert list(entry) == [2, 1, 3] and entry[2].rank == 2


def test_no_top_k_gives_the_chosen_token_alone():
    assert list(position_logprobs(5, -1.0, 1, None, None, 0, texts)) == [5]
