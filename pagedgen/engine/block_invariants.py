"""What must hold between any two calls of a BlockManager, checked in full (tests and debugging:
O(blocks)); no torch."""

from collections import Counter
from typing import TYPE_CHECKING

from pagedgen.engine.block_pool import NULL_BLOCK

if TYPE_CHECKING:
    from pagedgen.engine.block_manager import BlockManager


def check_integrity(bm: "BlockManager") -> None:
    """Raises AssertionError unless ref counts, the free queue, the hash index and the CPU pool
    all agree with the block tables."""
    for seq in [*bm.seqs.values(), *bm.swapped.values()]:
        num_freed = seq.block_table.count(NULL_BLOCK)
        assert NULL_BLOCK not in seq.block_table[num_freed:], f"{seq}: freed blocks not a prefix"
        assert bm.sliding_window is not None or not num_freed, seq
    for seq in bm.seqs.values():
        assert not seq.is_finished, f"finished {seq} still holds blocks"
        held = [b for b in seq.block_table if b != NULL_BLOCK]
        assert len(set(held)) == len(held), f"{seq} repeats a block"
        assert len(seq.block_table) <= bm.num_blocks_for(seq.num_tokens), seq
        assert seq.num_cached_blocks <= len(seq.block_table), seq
    assert not set(bm.seqs) & set(bm.swapped), "a sequence is on both sides"
    bm.pool.check_integrity(
        Counter(b for seq in bm.seqs.values() for b in seq.block_table if b != NULL_BLOCK)
    )
    bm.cpu_pool.check_integrity(
        Counter(b for seq in bm.swapped.values() for b in seq.block_table if b != NULL_BLOCK)
    )
