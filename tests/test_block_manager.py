import random

import pytest

from pagedgen.engine.block_manager import BlockManager
from pagedgen.engine.sequence import Sequence
from pagedgen.sampling_params import SamplingParams


def make_seq(num_prompt_tokens: int) -> Sequence:
    return Sequence("r", list(range(num_prompt_tokens)), SamplingParams())


def test_blocks_are_taken_only_at_block_boundaries():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(5)
    bm.allocate(seq)
    assert len(seq.block_table) == 2 and bm.num_free_blocks == 6
    for num_tokens in range(6, 14):
        seq.append_token_id(0)
        assert seq.num_tokens == num_tokens
        assert bm.can_append_slot(seq)
        bm.append_slot(seq)
        assert len(seq.block_table) == (num_tokens + 3) // 4
        bm.check_integrity()


def test_free_returns_every_block():
    bm = BlockManager(num_blocks=10, block_size=4)
    seqs = [make_seq(n) for n in (3, 8, 9)]
    for seq in seqs:
        bm.allocate(seq)
    assert bm.num_used_blocks == 1 + 2 + 3
    bm.free(seqs[1])
    assert bm.num_used_blocks == 4 and seqs[1].block_table == []
    bm.check_integrity()
    for seq in (seqs[0], seqs[2]):
        bm.free(seq)
    assert bm.num_free_blocks == 10
    bm.check_integrity()


def test_can_allocate_respects_free_blocks_and_watermark():
    bm = BlockManager(num_blocks=100, block_size=4, watermark=0.05)
    big = make_seq(4 * 100)
    assert bm.can_allocate(big)  # an idle pool needs no watermark
    small = make_seq(4 * 90)
    bm.allocate(small)
    assert bm.can_allocate(make_seq(4 * 6)) is False  # 10 free, 5 held back
    assert bm.can_allocate(make_seq(4 * 5))


def test_check_integrity_catches_corruption():
    bm = BlockManager(num_blocks=4, block_size=2)
    a, b = make_seq(2), make_seq(2)
    bm.allocate(a)
    bm.allocate(b)
    b.block_table[0] = a.block_table[0]  # one block owned twice
    with pytest.raises(AssertionError):
        bm.check_integrity()


@pytest.mark.parametrize("seed", range(3))
def test_random_operations_keep_integrity(seed: int):
    rng = random.Random(seed)
    bm = BlockManager(num_blocks=64, block_size=rng.choice([1, 4, 16]))
    live: list[Sequence] = []
    for _ in range(3000):
        op = rng.random()
        if op < 0.3:
            seq = make_seq(rng.randint(1, 40))
            if bm.can_allocate(seq):
                bm.allocate(seq)
                live.append(seq)
        elif op < 0.8 and live:
            seq = rng.choice(live)
            seq.append_token_id(1)
            if bm.can_append_slot(seq):
                bm.append_slot(seq)
            else:
                live.remove(seq)
                bm.free(seq)
        elif live:
            seq = live.pop(rng.randrange(len(live)))
            bm.free(seq)
        bm.check_integrity()
        held = sum(len(seq.block_table) for seq in live)
        assert held + bm.num_free_blocks == bm.num_blocks
