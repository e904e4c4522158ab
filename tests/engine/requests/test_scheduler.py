"""Scheduler without a model: budgets, chunked prefill, priority, preemption by recompute."""

from tests.engine.helpers import make_seq
from workbench.engine.requests.block_manager import BlockManager
from workbench.engine.requests.request import SequenceStatus
from workbench.engine.requests.scheduler import Scheduler


def scheduler(num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
              chunked=True, policy="fcfs", prefix_caching=True) -> Scheduler:
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=prefix_caching)
    return Scheduler(bm, max_num_seqs, max_num_batched_tokens, chunked, policy)


def run_step(sched: Scheduler):
    """Schedules a step and plays the engine's part: compute, sample a dummy token, finish."""
    out = sched.schedule()
    for s in out.scheduled:
        completes = s.completes_tokens
        s.seq.num_computed_tokens += s.num_tokens
        sched.block_manager.commit(s.seq)
        if completes:
            s.seq.token_ids.append(1000 + len(s.seq.token_ids))
            if s.seq.num_output_tokens >= s.seq.request.params.max_tokens:
                sched.finish(s.seq)
    return out


def planned(out) -> dict[str, int]:
    return {s.seq.seq_id: s.num_tokens for s in out.scheduled}


def test_a_waiting_prompt_is_scheduled_whole_within_the_budget():
    sched = scheduler()
    seq = make_seq("a", list(range(10)))
    sched.add(seq)
    out = sched.schedule()
    assert planned(out) == {"a#0": 10}
    assert out.scheduled[0].completes_tokens
    assert seq.status is SequenceStatus.RUNNING and sched.running == [seq]
    assert len(seq.block_table) == 3


def test_max_num_seqs_caps_the_batch():
    sched = scheduler(max_num_seqs=2)
    seqs = [make_seq(r, [i, i + 1, i + 2], arrival_time=i) for i, r in enumerate("abc")]
    for seq in seqs:
        sched.add(seq)
    out = sched.schedule()
    assert planned(out) == {"a#0": 3, "b#0": 3}
    assert list(sched.waiting) == [seqs[2]]


def test_max_num_batched_tokens_caps_the_step_and_chunks_the_last_prompt():
    sched = scheduler(max_num_batched_tokens=16)
    sched.add(make_seq("a", list(range(10)), arrival_time=0))
    sched.add(make_seq("b", list(range(100, 110)), arrival_time=1))
    out = sched.schedule()
    assert planned(out) == {"a#0": 10, "b#0": 6}
    assert out.num_tokens == 16
    assert [s.completes_tokens for s in out.scheduled] == [True, False]


def test_chunked_prefill_splits_a_long_prompt_over_steps():
    sched = scheduler(max_num_batched_tokens=8)
    seq = make_seq("a", list(range(20)))
    sched.add(seq)
    chunks = []
    for _ in range(3):
        out = run_step(sched)
        chunks.append((out.scheduled[0].num_tokens, len(seq.output_token_ids)))
    assert chunks == [(8, 0), (8, 0), (4, 1)]  # only the last chunk yields a token


def test_without_chunked_prefill_a_prompt_that_does_not_fit_waits_whole():
    sched = scheduler(max_num_batched_tokens=16, chunked=False)
    sched.add(make_seq("a", list(range(10)), arrival_time=0))
    second = make_seq("b", list(range(100, 110)), arrival_time=1)
    sched.add(second)
    out = sched.schedule()
    assert planned(out) == {"a#0": 10}
    assert list(sched.waiting) == [second] and second.block_table == []


def test_running_decodes_are_served_before_new_prompts():
    sched = scheduler(max_num_batched_tokens=8)
    sched.add(make_seq("a", list(range(6)), arrival_time=0))
    run_step(sched)
    sched.add(make_seq("b", list(range(100, 120)), arrival_time=1))
    out = sched.schedule()
    assert planned(out) == {"a#0": 1, "b#0": 7}


def test_fcfs_admits_in_submission_order():
    sched = scheduler(max_num_seqs=1)
    sched.add(make_seq("late", [1, 2, 3], arrival_time=5.0, priority=0))
    sched.add(make_seq("early", [4, 5, 6], arrival_time=1.0, priority=9))
    # fcfs keeps the queue in submission order: the first one added goes first
    assert planned(sched.schedule()) == {"late#0": 3}


def test_priority_policy_admits_lower_priority_values_first():
    sched = scheduler(max_num_seqs=1, policy="priority")
    sched.add(make_seq("low", [1, 2, 3], arrival_time=0.0, priority=5))
    sched.add(make_seq("high", [4, 5, 6], arrival_time=1.0, priority=0))
    sched.add(make_seq("mid", [7, 8, 9], arrival_time=2.0, priority=1))
    order = []
    for _ in range(3):
        out = sched.schedule()
        order.append(out.scheduled[0].seq.request.request_id)
        sched.finish(out.scheduled[0].seq)
    assert order == ["high", "mid", "low"]


def test_priority_policy_breaks_ties_by_arrival():
    sched = scheduler(max_num_seqs=1, policy="priority")
    sched.add(make_seq("second", [1, 2], arrival_time=2.0, priority=1))
    sched.add(make_seq("first", [3, 4], arrival_time=1.0, priority=1))
    assert planned(sched.schedule()) == {"first#0": 2}


def test_finish_frees_blocks_and_leaves_the_queues():
    sched = scheduler()
    seq = make_seq("a", list(range(10)))
    sched.add(seq)
    sched.schedule()
    sched.finish(seq)
    assert not sched.has_unfinished()
    assert seq.status is SequenceStatus.FINISHED and seq.block_table == []
    assert sched.block_manager.num_free_blocks == 64


def test_finish_of_a_waiting_sequence_removes_it():
    sched = scheduler(max_num_seqs=1)
    sched.add(make_seq("a", [1, 2], arrival_time=0))
    waiting = make_seq("b", [3, 4], arrival_time=1)
    sched.add(waiting)
    sched.schedule()
    sched.finish(waiting)
    assert list(sched.waiting) == []


def two_decoding_sequences(policy="fcfs", priorities=(0, 0)):
    """4 blocks of 4 slots, two 7-token prompts: the cache is full after their prefill."""
    sched = scheduler(num_blocks=4, block_size=4, policy=policy, prefix_caching=False)
    a = make_seq("a", list(range(7)), arrival_time=0, priority=priorities[0], max_tokens=6)
    b = make_seq("b", list(range(100, 107)), arrival_time=1, priority=priorities[1], max_tokens=6)
    sched.add(a)
    sched.add(b)
    run_step(sched)  # both prefilled: 8 tokens each, 4 blocks used
    run_step(sched)  # both decode into their second block: 9 tokens each
    return sched, a, b


def test_running_out_of_blocks_preempts_the_latest_arrival():
    sched, a, b = two_decoding_sequences()
    out = sched.schedule()  # a needs a third block: b must go
    assert out.preempted == [b]
    assert planned(out) == {"a#0": 1}
    assert b.status is SequenceStatus.WAITING and b.block_table == []
    assert b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert sched.waiting[0] is b and sched.num_preemptions == 1


def test_priority_policy_preempts_the_lowest_priority():
    sched, a, b = two_decoding_sequences(policy="priority", priorities=(5, 0))
    out = sched.schedule()  # b runs first (priority 0) and needs a block: a goes
    assert out.preempted == [a]
    assert planned(out) == {"b#0": 1}


def test_nothing_is_admitted_in_a_step_that_preempted():
    sched, a, b = two_decoding_sequences()
    sched.add(make_seq("c", [1], arrival_time=2))
    out = sched.schedule()
    assert out.preempted and "c#0" not in planned(out)


def test_a_preempted_sequence_recomputes_everything_and_finishes():
    sched, a, b = two_decoding_sequences()
    tokens_before = list(b.token_ids)
    resumed = None
    for _ in range(20):
        out = run_step(sched)
        step = planned(out)
        if "b#0" in step and resumed is None and b.num_preemptions:
            resumed = step["b#0"]
        if not sched.has_unfinished():
            break
    assert a.is_finished and b.is_finished
    assert resumed == len(tokens_before)  # prompt + the 2 tokens generated before preemption
    assert b.token_ids[:len(tokens_before)] == tokens_before
    assert b.num_output_tokens == 6
    assert sched.block_manager.num_free_blocks == 4


def test_a_request_with_n_samples_waits_for_room_for_all_of_them():
    sched = scheduler(max_num_seqs=3)
    sched.add(make_seq("one", [1, 2], arrival_time=0))
    run_step(sched)
    sched.add(make_seq("three", [3, 4], arrival_time=1, n=3))
    assert planned(sched.schedule()) == {"one#0": 1}  # 1 running + 3 samples > 3
