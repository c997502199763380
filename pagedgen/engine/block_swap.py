"""Swap preemption's half of the block manager: a preempted group's blocks move to the CPU pool
and come back when it resumes (vLLM V0's swap space); plain Python, no torch."""

from collections import Counter
from collections.abc import Callable

from pagedgen.engine.block_pool import NULL_BLOCK, BlockMapping, BlockPool, CpuBlockPool
from pagedgen.engine.sequence import Sequence


class BlockSwapMixin:
    """BlockManager's swap_out and swap_in, all or none like its other allocations. A shared
    block moves once and stays shared: its CPU copy is held by every sequence that held it."""

    # BlockManager's state and the methods of it these use.
    pool: BlockPool
    cpu_pool: CpuBlockPool
    seqs: dict[int, Sequence]  # holding device blocks
    swapped: dict[int, Sequence]  # holding CPU blocks
    free: Callable[[Sequence], None]
    allocate_slots: Callable[[list[Sequence], list[int]], BlockMapping | None]
    _num_blocks_to_append: Callable[[list[Sequence], list[int], Callable[[int], int]], int]
    _num_admittable_blocks: Callable[[], int]

    def swap_out(self, seqs: list[Sequence]) -> BlockMapping | None:
        """Moves the sequences' blocks to the CPU pool, shared blocks once, all or none; returns
        the (device, CPU) block copies to do, or None when the CPU pool is short."""
        assert all(seq.seq_id in self.seqs for seq in seqs)
        unique = list(dict.fromkeys(b for seq in seqs for b in seq.block_table if b != NULL_BLOCK))
        if len(unique) > self.cpu_pool.num_free_blocks:
            return None
        tables = [list(seq.block_table) for seq in seqs]
        mapping = {block_id: self.cpu_pool.allocate() for block_id in unique}
        for seq, table in zip(seqs, tables):
            self.free(seq)
            seq.set_block_table([mapping.get(block_id, NULL_BLOCK) for block_id in table])
            for cpu_block_id in seq.block_table:
                if cpu_block_id != NULL_BLOCK:
                    self.cpu_pool.hold(cpu_block_id)
            self.swapped[seq.seq_id] = seq
        return list(mapping.items())

    def swap_in(
        self, seqs: list[Sequence], num_new_tokens: list[int]
    ) -> tuple[BlockMapping, BlockMapping] | None:
        """Brings swapped sequences back and makes room for their next num_new_tokens tokens, all
        or none; returns the (CPU, device) block copies and the copy-on-write copies to do after
        them, or None."""
        assert all(seq.seq_id in self.swapped for seq in seqs)
        holders = Counter(
            cpu_id for seq in seqs for cpu_id in seq.block_table if cpu_id != NULL_BLOCK
        )
        needed = len(holders) + self._num_blocks_to_append(
            seqs, num_new_tokens, holders.__getitem__
        )
        if needed > self._num_admittable_blocks():
            return None
        mapping = {}
        for cpu_id, num_holders in holders.items():
            block = self.pool.allocate()
            block.ref_count = num_holders
            mapping[cpu_id] = block.block_id
        for seq in seqs:
            cpu_table = seq.block_table
            self.free(seq)
            seq.set_block_table([mapping.get(cpu_id, NULL_BLOCK) for cpu_id in cpu_table])
            self.seqs[seq.seq_id] = seq
        copies = self.allocate_slots(seqs, num_new_tokens)
        assert copies is not None, "swap_in counted the appends' blocks"
        return list(mapping.items()), copies
