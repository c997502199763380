from itertools import count

import pytest

from pagedgen.core.block_manager import BlockManager, PromptPlan
from pagedgen.core.block_pool import Block, FreeBlockQueue
from pagedgen.core.sequence import Sequence
from pagedgen.sampling_params import SamplingParams

_seq_ids = count()
_distinct_tokens = count(10**6)


def distinct_seq(num_tokens: int) -> Sequence:
    """A sequence sharing no prefix with any other."""
    return make_seq([next(_distinct_tokens) for _ in range(num_tokens)])


def make_seq(token_ids: list[int] | int) -> Sequence:
    if isinstance(token_ids, int):
        token_ids = list(range(token_ids))
    return Sequence(next(_seq_ids), "r", token_ids, SamplingParams())


def try_admit(bm: BlockManager, *seqs: Sequence) -> list[PromptPlan] | None:
    """Admits waiting sequences for all their remaining tokens, as the scheduler does, and
    pretends the step ran."""
    plans = bm.allocate_prompt(list(seqs), lambda seq, num_computed: seq.num_tokens - num_computed)
    for seq in seqs if plans is not None else ():
        seq.num_computed_tokens = seq.num_tokens
    return plans


def admit(bm: BlockManager, *seqs: Sequence) -> list[PromptPlan]:
    plans = try_admit(bm, *seqs)
    assert plans is not None
    return plans


def decode(bm: BlockManager, seq: Sequence, token: int = 0) -> list[tuple[int, int]]:
    seq.append_token_id(token)
    copies = bm.allocate_slots([seq], [1])
    assert copies is not None
    seq.num_computed_tokens += 1
    bm.check_integrity()
    return copies


def test_free_queue_is_lru_with_removal_from_the_middle():
    blocks = [Block(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[2])
    assert [b.block_id for b in queue] == [0, 1, 3, 4]
    assert queue.popleft() is blocks[0]
    queue.append(blocks[0])
    assert [b.block_id for b in queue] == [1, 3, 4, 0] and len(queue) == 4
    with pytest.raises(AssertionError):
        queue.append(blocks[1])  # already queued


def test_blocks_are_taken_only_at_block_boundaries():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    seq = make_seq(5)
    admit(bm, seq)
    assert len(seq.block_table) == 2 and bm.num_free_blocks == 6
    for num_tokens in range(6, 14):
        decode(bm, seq)
        assert seq.num_tokens == num_tokens
        assert len(seq.block_table) == (num_tokens + 3) // 4


def test_free_returns_every_block():
    bm = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    seqs = [make_seq(n) for n in (3, 8, 9)]
    for seq in seqs:
        admit(bm, seq)
    assert bm.num_used_blocks == 1 + 2 + 3
    bm.free(seqs[1])
    assert bm.num_used_blocks == 4 and seqs[1].block_table == []
    bm.check_integrity()
    for seq in (seqs[0], seqs[2]):
        bm.free(seq)
    assert bm.num_free_blocks == 10
    bm.check_integrity()


def test_watermark_applies_only_while_sequences_run():
    bm = BlockManager(num_blocks=100, block_size=4, watermark=0.05)
    big = distinct_seq(4 * 100)
    admit(bm, big)  # an idle pool needs no watermark
    bm.free(big)
    admit(bm, distinct_seq(4 * 90))
    assert try_admit(bm, distinct_seq(4 * 6)) is None  # 10 free, 5 held back
    assert bm.num_free_blocks == 10  # and nothing was taken
    assert try_admit(bm, distinct_seq(4 * 5)) is not None


def test_a_group_is_admitted_all_or_nothing():
    bm = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    assert try_admit(bm, distinct_seq(4 * 6), distinct_seq(4 * 5)) is None
    assert bm.num_free_blocks == 10 and not bm.seqs
    bm.check_integrity()


def test_prefix_hits_share_full_blocks_and_leave_a_token_to_compute():
    bm = BlockManager(num_blocks=16, block_size=4)
    system = list(range(100, 110))  # 2 full blocks + 2 tokens
    first = make_seq(system + [1, 2])
    admit(bm, first)
    second = make_seq(system + [3, 4, 5])
    assert admit(bm, second) == [PromptPlan(8, 5)]
    assert second.block_table[:2] == first.block_table[:2]
    assert bm.pool.blocks[first.block_table[0]].ref_count == 2
    # identical prompt of exactly 3 blocks: the last block is recomputed, not hit
    exact = make_seq(first.token_ids)
    assert admit(bm, exact) == [PromptPlan(8, 4)]
    assert bm.num_prefix_cache_hits == 16 and bm.num_prefix_cache_queries == 12 + 13 + 12
    bm.check_integrity()


def test_freed_blocks_stay_cached_until_evicted():
    bm = BlockManager(num_blocks=4, block_size=2)
    seq = make_seq([1, 2, 3, 4, 5])
    admit(bm, seq)
    held = list(seq.block_table)
    bm.free(seq)
    bm.check_integrity()
    again = make_seq([1, 2, 3, 4, 9])
    assert admit(bm, again) == [PromptPlan(4, 1)] and again.block_table[:2] == held[:2]
    bm.free(again)
    filler = make_seq(8)  # takes every free block: the cached ones are evicted
    admit(bm, filler)
    assert bm.pool.num_evictions == 2
    assert all(b.block_hash in filler.block_hashes for b in bm.pool.cached.values())
    bm.free(filler)
    assert admit(bm, make_seq([1, 2, 3, 4, 9])) == [PromptPlan(0, 5)]
    bm.check_integrity()


def test_reset_prefix_cache_forgets_cached_blocks_only_while_none_is_in_use():
    bm = BlockManager(num_blocks=6, block_size=2)
    seq = make_seq([1, 2, 3, 4, 5])
    admit(bm, seq)
    assert not bm.pool.reset_prefix_cache() and bm.pool.cached  # seq still holds its blocks
    bm.free(seq)
    assert bm.pool.reset_prefix_cache() and not bm.pool.cached
    bm.check_integrity()
    assert admit(bm, make_seq([1, 2, 3, 4, 9])) == [PromptPlan(0, 5)]  # computed afresh
    bm.check_integrity()


def test_fork_shares_blocks_and_copies_the_partial_block_on_write():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=False)
    parent = make_seq(6)
    admit(bm, parent)
    child = parent.fork(next(_seq_ids))
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    bm.check_integrity()
    shared_partial = parent.block_table[1]
    copies = decode(bm, parent)
    assert copies == [(shared_partial, parent.block_table[1])]
    assert parent.block_table[0] == child.block_table[0]  # full blocks stay shared
    assert decode(bm, child) == []  # the last holder writes in place
    assert child.block_table[1] == shared_partial
    bm.free(parent)
    bm.free(child)
    assert bm.num_free_blocks == 16
    bm.check_integrity()


def test_swap_out_and_in_keeps_sharing_all_or_nothing():
    bm = BlockManager(num_blocks=16, block_size=4, num_cpu_blocks=3, enable_prefix_caching=False)
    parent = make_seq(6)
    admit(bm, parent)
    child = parent.fork(next(_seq_ids))
    bm.fork(parent, child)
    decode(bm, child)  # child now owns a copy of the partial block: 3 unique blocks
    out = bm.swap_out([parent, child])
    assert len(out) == 3 and bm.num_free_blocks == 16 and bm.num_free_cpu_blocks == 0
    assert parent.block_table[0] == child.block_table[0]  # still shared, now on the CPU
    bm.check_integrity()
    other = make_seq(4)
    admit(bm, other)
    assert bm.swap_out([other]) is None  # CPU pool full
    back, copies = bm.swap_in([parent, child], [0, 0])
    assert copies == []
    assert sorted(cpu for cpu, _ in back) == sorted(cpu for _, cpu in out)
    assert parent.block_table[0] == child.block_table[0]
    assert bm.pool.blocks[parent.block_table[0]].ref_count == 2
    assert bm.num_free_cpu_blocks == 3
    bm.check_integrity()


def test_check_integrity_catches_corruption():
    bm = BlockManager(num_blocks=4, block_size=2)
    a, b = make_seq(2), make_seq([7, 8])
    admit(bm, a)
    admit(bm, b)
    b.block_table[0] = a.block_table[0]  # one block owned twice, another leaked
    with pytest.raises(AssertionError):
        bm.check_integrity()


@pytest.mark.parametrize("corruption", ["stray count", "held count", "free twice", "held and free"])
def test_check_integrity_catches_a_corrupt_cpu_pool(corruption):
    bm = BlockManager(num_blocks=8, block_size=2, num_cpu_blocks=6)
    seq = make_seq(5)
    admit(bm, seq)
    bm.swap_out([seq])  # CPU blocks 0-2 held, 3-5 free
    bm.check_integrity()
    pool = bm.cpu_pool
    held, free = seq.block_table[0], pool.free_block_ids[-1]
    if corruption == "stray count":
        pool.ref_counts[free] = 1
    elif corruption == "held count":
        pool.ref_counts[held] = 2
    elif corruption == "free twice":
        pool.free_block_ids.append(free)
    else:
        pool.free_block_ids[0] = held
    with pytest.raises(AssertionError):
        bm.check_integrity()
