"""BlockManager without a model: block tables, prefix cache, reference counts, COW forks."""

import pytest

from tests.engine.helpers import make_seq
from workbench.engine.requests.block_manager import BlockManager, NoFreeBlocksError


def computed(bm: BlockManager, seq, num_tokens: int) -> list[tuple[int, int]]:
    """Reserves `num_tokens` more tokens for `seq` and marks them computed, as a step would."""
    copies = bm.reserve(seq, num_tokens)
    seq.num_computed_tokens += num_tokens
    bm.commit(seq)
    return copies


def test_reserve_hands_out_blocks_in_order_and_covers_every_token():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq("a", list(range(10)))
    assert bm.reserve(seq, 10) == []
    assert seq.block_table == [0, 1, 2]
    assert bm.num_free_blocks == 5


def test_reserving_more_tokens_grows_the_table_only_at_block_boundaries():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq("a", list(range(6)))
    computed(bm, seq, 6)
    assert bm.blocks_needed(seq, 2) == 0
    computed(bm, seq, 2)
    assert len(seq.block_table) == 2
    assert bm.blocks_needed(seq, 1) == 1
    computed(bm, seq, 1)
    assert len(seq.block_table) == 3


def test_reserve_without_room_raises_and_takes_nothing():
    bm = BlockManager(num_blocks=2, block_size=4)
    seq = make_seq("a", list(range(9)))
    assert not bm.can_reserve(seq, 9)
    with pytest.raises(NoFreeBlocksError):
        bm.reserve(seq, 9)
    assert bm.num_free_blocks == 2 and seq.block_table == []


def test_free_returns_every_block_and_empties_the_table():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq("a", list(range(10)))
    computed(bm, seq, 10)
    bm.free(seq)
    assert bm.num_free_blocks == 8 and seq.block_table == []
    assert bm.usage == 0.0


def test_usage_is_the_fraction_of_blocks_held():
    bm = BlockManager(num_blocks=8, block_size=4)
    computed(bm, make_seq("a", list(range(8))), 8)
    assert bm.usage == pytest.approx(2 / 8)


def test_a_second_sequence_with_the_same_prefix_reuses_its_full_blocks():
    bm = BlockManager(num_blocks=8, block_size=4)
    first = make_seq("a", list(range(10)))
    computed(bm, first, 10)
    second = make_seq("b", list(range(9)) + [99])
    assert bm.allocate_cached_prefix(second) == 8
    assert second.block_table == first.block_table[:2]
    assert second.num_computed_tokens == 8


def test_shared_prefix_blocks_are_reference_counted():
    bm = BlockManager(num_blocks=8, block_size=4)
    first = make_seq("a", list(range(10)))
    computed(bm, first, 10)
    second = make_seq("b", list(range(10)))
    bm.allocate_cached_prefix(second)
    shared = first.block_table[:2]
    assert [bm.blocks[b].ref_count for b in shared] == [2, 2]
    bm.free(first)
    assert [bm.blocks[b].ref_count for b in shared] == [1, 1]
    assert not set(shared) & set(bm._free)
    bm.free(second)
    assert bm.num_free_blocks == 8


def test_a_freed_sequence_blocks_stay_cached_until_evicted():
    bm = BlockManager(num_blocks=8, block_size=4)
    first = make_seq("a", list(range(10)))
    computed(bm, first, 10)
    bm.free(first)
    again = make_seq("b", list(range(10)))
    assert bm.allocate_cached_prefix(again) == 8
    assert bm.num_free_blocks == 6  # the two cached blocks left the free list


def test_at_least_one_prompt_token_is_left_to_compute():
    bm = BlockManager(num_blocks=8, block_size=4)
    computed(bm, make_seq("a", list(range(8))), 8)
    same = make_seq("b", list(range(8)))
    assert bm.allocate_cached_prefix(same) == 4  # not 8: the last token must produce logits


def test_a_different_token_in_an_early_block_breaks_the_chain():
    bm = BlockManager(num_blocks=8, block_size=4)
    computed(bm, make_seq("a", list(range(12))), 12)
    other = make_seq("b", [0, 1, 2, 77] + list(range(4, 13)))
    assert bm.allocate_cached_prefix(other) == 0  # block 2 matches alone, but hashes chain


def test_cache_salt_separates_prefixes():
    bm = BlockManager(num_blocks=8, block_size=4)
    computed(bm, make_seq("a", list(range(10))), 10)
    salted = make_seq("b", list(range(10)))
    salted.request.cache_salt = "tenant-2"
    assert bm.allocate_cached_prefix(salted) == 0


def test_prompt_logprobs_requests_bypass_the_prefix_cache():
    bm = BlockManager(num_blocks=8, block_size=4)
    computed(bm, make_seq("a", list(range(10))), 10)
    wants_lps = make_seq("b", list(range(10)), prompt_logprobs=1)
    assert bm.allocate_cached_prefix(wants_lps) == 0


def test_disabled_prefix_caching_never_hits():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    first = make_seq("a", list(range(10)))
    computed(bm, first, 10)
    bm.free(first)
    assert bm.allocate_cached_prefix(make_seq("b", list(range(10)))) == 0


def test_reset_prefix_cache_forgets_free_blocks_only():
    bm = BlockManager(num_blocks=8, block_size=4)
    live = make_seq("a", list(range(10)))
    computed(bm, live, 10)
    dead = make_seq("b", list(range(100, 110)))
    computed(bm, dead, 10)
    bm.free(dead)
    bm.reset_prefix_cache()
    assert bm.allocate_cached_prefix(make_seq("c", list(range(100, 110)))) == 0
    assert bm.allocate_cached_prefix(make_seq("d", list(range(10)))) == 8


def test_eviction_takes_never_used_blocks_before_cached_ones():
    bm = BlockManager(num_blocks=8, block_size=4)
    first = make_seq("a", list(range(9)))
    computed(bm, first, 9)  # blocks 0, 1 cached, block 2 partial
    bm.free(first)
    filler = make_seq("f", list(range(500, 520)))
    computed(bm, filler, 20)  # 5 blocks: 3..7, untouched before
    assert sorted(filler.block_table) == [3, 4, 5, 6, 7]
    assert bm.allocate_cached_prefix(make_seq("b", list(range(9)))) == 8


def test_eviction_takes_the_tail_of_a_freed_prefix_first():
    bm = BlockManager(num_blocks=4, block_size=4)
    first = make_seq("a", list(range(13)))
    computed(bm, first, 13)  # blocks 0, 1, 2 cached
    bm.free(first)
    filler = make_seq("f", list(range(500, 508)))
    computed(bm, filler, 8)  # takes the never-hashed block 3, then the prefix's last block
    assert bm.allocate_cached_prefix(make_seq("b", list(range(13)))) == 8


def test_eviction_takes_the_least_recently_freed_prefix_first():
    bm = BlockManager(num_blocks=4, block_size=4)
    old = make_seq("old", list(range(5)))
    computed(bm, old, 5)
    new = make_seq("new", list(range(100, 105)))
    computed(bm, new, 5)
    bm.free(old)
    bm.free(new)
    computed(bm, make_seq("f", list(range(500, 508))), 8)  # two blocks evicted
    assert bm.allocate_cached_prefix(make_seq("old2", list(range(5)))) == 0
    assert bm.allocate_cached_prefix(make_seq("new2", list(range(100, 105)))) == 4


def test_fork_shares_every_block_by_reference():
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = make_seq("a", list(range(6)), n=2)
    computed(bm, parent, 6)
    child = parent.fork(1)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert [bm.blocks[b].ref_count for b in parent.block_table] == [2, 2]
    assert bm.num_free_blocks == 6


def test_writing_into_a_shared_partial_block_copies_it_first():
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = make_seq("a", list(range(6)), n=2)
    computed(bm, parent, 6)
    child = parent.fork(1)
    bm.fork(parent, child)
    shared_last = parent.block_table[1]
    assert bm.blocks_needed(child, 1) == 1
    copies = bm.reserve(child, 1)
    assert copies == [(shared_last, child.block_table[1])]
    assert child.block_table[0] == parent.block_table[0]
    assert child.block_table[1] != shared_last
    assert bm.blocks[shared_last].ref_count == 1
    assert bm.reserve(parent, 1) == []  # now the parent's block is its own again
    assert parent.block_table[1] == shared_last


def test_forking_at_a_block_boundary_copies_nothing():
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = make_seq("a", list(range(8)), n=2)
    computed(bm, parent, 8)
    child = parent.fork(1)
    bm.fork(parent, child)
    assert bm.reserve(child, 1) == []
    assert child.block_table[:2] == parent.block_table and len(child.block_table) == 3


def test_freeing_forked_sequences_returns_all_blocks():
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = make_seq("a", list(range(6)), n=3)
    computed(bm, parent, 6)
    children = [parent.fork(i) for i in (1, 2)]
    for child in children:
        bm.fork(parent, child)
        bm.reserve(child, 1)
    bm.reserve(parent, 1)
    for seq in [parent, *children]:
        bm.free(seq)
    assert bm.num_free_blocks == 8
    assert all(b.ref_count == 0 for b in bm.blocks)
