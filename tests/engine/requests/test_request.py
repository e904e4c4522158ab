"""Request and Sequence: token bookkeeping, ids and forking, without a model."""

from tests.engine.helpers import make_request
from workbench.engine.requests.request import SequenceStatus


def test_output_tokens_are_those_after_the_prompt():
    seq = make_request("r", [1, 2, 3]).sequences[0]
    seq.token_ids += [7, 8]
    assert seq.output_token_ids == [7, 8] and seq.num_output_tokens == 2
    seq.num_computed_tokens = 4
    assert seq.num_uncomputed_tokens == 1


def test_a_fork_copies_tokens_and_state_but_not_the_list_objects():
    seq = make_request("r", [1, 2, 3], n=2).sequences[0]
    seq.num_computed_tokens, seq.block_table, seq.status = 3, [5], SequenceStatus.RUNNING
    child = seq.fork(1)
    assert (child.index, child.seq_id, child.token_ids, child.num_computed_tokens) == (
        1, "r#1", [1, 2, 3], 3)
    assert child.status is SequenceStatus.RUNNING and child.block_table == [5]
    child.token_ids.append(9)
    child.block_table.append(6)
    assert seq.token_ids == [1, 2, 3] and seq.block_table == [5]


def test_a_request_is_finished_when_all_its_sequences_are():
    req = make_request("r", [1], n=2)
    req.sequences.append(req.sequences[0].fork(1))
    req.sequences[0].status = SequenceStatus.FINISHED
    assert not req.finished
    req.sequences[1].status = SequenceStatus.FINISHED
    assert req.finished


def test_logprob_lists_exist_only_when_asked_for():
    assert make_request("a", [1]).sequences[0].logprobs is None
    assert make_request("b", [1], logprobs=2).sequences[0].logprobs == []
    assert make_request("c", [1], prompt_logprobs=2).prompt_logprobs == [None]


def test_priority_orders_by_priority_then_arrival():
    early = make_request("e", [1], priority=1, arrival_time=1.0).sequences[0]
    late = make_request("l", [1], priority=0, arrival_time=2.0).sequences[0]
    assert late.priority < early.priority
