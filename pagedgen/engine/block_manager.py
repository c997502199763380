from collections import deque

from pagedgen.engine.sequence import Sequence


class BlockManager:
    """Hands out fixed-size KV-cache blocks; plain Python, no torch.

    A sequence holding n tokens owns ceil(n / block_size) blocks in seq.block_table: logical block
    i of the sequence lives in physical block block_table[i]. A block is taken only when a sequence
    crosses a block boundary, and all of a sequence's blocks return to the free queue in free().
    ref_counts[b] counts the block tables that hold block b; a block is free iff its count is 0.
    """

    def __init__(self, num_blocks: int, block_size: int, watermark: float = 0.01) -> None:
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.watermark_blocks = int(watermark * num_blocks)
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.seqs: dict[int, Sequence] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_block_ids)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_missing_blocks(self, seq: Sequence) -> int:
        return max(0, self.num_blocks_for(seq.num_tokens) - len(seq.block_table))

    def fits_in_pool(self, num_tokens: int) -> bool:
        return self.num_blocks_for(num_tokens) <= self.num_blocks

    def can_allocate(self, seq: Sequence) -> bool:
        # The watermark keeps a little room for running sequences to grow into, so that an
        # admission does not cause a preemption on the very next step. An idle pool skips it.
        watermark = self.watermark_blocks if self.seqs else 0
        return self.num_missing_blocks(seq) <= self.num_free_blocks - watermark

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table and seq.seq_id not in self.seqs
        self.seqs[seq.seq_id] = seq
        self._grow(seq)

    def can_append_slot(self, seq: Sequence) -> bool:
        return self.num_missing_blocks(seq) <= self.num_free_blocks

    def append_slot(self, seq: Sequence) -> None:
        assert seq.seq_id in self.seqs
        self._grow(seq)

    def free(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self.free_block_ids.append(block_id)
        seq.block_table = []
        self.seqs.pop(seq.seq_id, None)

    def _grow(self, seq: Sequence) -> None:
        missing = self.num_missing_blocks(seq)
        assert missing <= self.num_free_blocks, (missing, self.num_free_blocks)
        for _ in range(missing):
            block_id = self.free_block_ids.popleft()
            assert self.ref_counts[block_id] == 0
            self.ref_counts[block_id] = 1
            seq.block_table.append(block_id)

    def check_integrity(self) -> None:
        """Raises AssertionError if the pool's bookkeeping is inconsistent."""
        free = set(self.free_block_ids)
        assert len(free) == len(self.free_block_ids), "a block is in the free queue twice"
        owners = [0] * self.num_blocks
        for seq in self.seqs.values():
            assert not seq.is_finished, f"finished {seq} still holds blocks"
            num_held = len(seq.block_table)
            assert (
                self.num_blocks_for(seq.num_computed_tokens)
                <= num_held
                <= self.num_blocks_for(seq.num_tokens)
            ), f"{seq} holds {num_held} blocks"
            for block_id in seq.block_table:
                owners[block_id] += 1
        for block_id in range(self.num_blocks):
            assert owners[block_id] == self.ref_counts[block_id], (
                f"block {block_id}: ref count {self.ref_counts[block_id]}, "
                f"held by {owners[block_id]} tables"
            )
            assert (owners[block_id] == 0) == (block_id in free), (
                f"block {block_id} is {'free' if block_id in free else 'used'} "
                f"with {owners[block_id]} owners"
            )
        assert len(free) + sum(1 for n in owners if n) == self.num_blocks
