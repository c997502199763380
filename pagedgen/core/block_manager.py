from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

from pagedgen.core.block_pool import NULL_BLOCK, Block, BlockMapping, BlockPool, CpuBlockPool
from pagedgen.core.prefix_hash import block_hashes
from pagedgen.core.prompt_hits import plan_prompt_hits
from pagedgen.core.sequence import Sequence

__all__ = ["NULL_BLOCK", "BlockManager", "BlockMapping", "PromptPlan"]


class PromptPlan(NamedTuple):
    """How a waiting sequence is admitted: its first num_computed_tokens tokens are prefix-cache
    hits, and this step computes the next num_new_tokens."""

    num_computed_tokens: int
    num_new_tokens: int


class BlockManager:
    """Maps sequences to KV-cache blocks; plain Python, no torch.

    Logical block i of a sequence lives in physical block seq.block_table[i]. A block is taken
    only when a sequence crosses a block boundary and returned when its last holder lets go;
    blocks are shared by reference count (prefix-cache hits, forked samples and beams) and
    copied on write. Sequences swapped out hold blocks of the CPU pool instead (swap_out and
    swap_in).

    Every allocation checks and commits in one call, all or nothing for a group of sequences:
    allocate_prompt (admission), allocate_slots (growth), swap_in, swap_out return None and
    change nothing when the pool is short. Admission and swap-in leave watermark_blocks free
    for running sequences to grow into, except on an idle pool, where a group that fits the pool
    must always be able to start.

    Prefix caching indexes every full block by a chained hash of its tokens, registered when the
    step that computes it is scheduled; a step writes K/V before any attention reads them, so a
    sequence scheduled in the same step may already attend to them.

    With a sliding_window (every layer attends to at most its last sliding_window tokens), a
    running sequence's blocks wholly before the window of its next query are freed as it grows
    (vLLM V1's SlidingWindowManager.remove_skipped_blocks): their table entries become
    NULL_BLOCK, always a prefix of the table, and attention never reads them. Freed blocks keep
    their hashes in the free queue, so prefix hits can still revive them.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_cpu_blocks: int = 0,
        enable_prefix_caching: bool = True,
        watermark: float = 0.01,
        sliding_window: int | None = None,
    ) -> None:
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = int(watermark * num_blocks)
        self.pool = BlockPool(num_blocks)
        self.cpu_pool = CpuBlockPool(num_cpu_blocks)
        self.seqs: dict[int, Sequence] = {}  # holding device blocks
        self.swapped: dict[int, Sequence] = {}  # holding CPU blocks
        self.num_prefix_cache_queries = 0  # tokens looked up
        self.num_prefix_cache_hits = 0  # tokens found
        self.sliding_window = sliding_window
        self.num_sliding_window_freed_blocks = 0

    # -- gauges ------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    @property
    def num_free_cpu_blocks(self) -> int:
        return self.cpu_pool.num_free_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _num_admittable_blocks(self) -> int:
        """Free blocks an admission or a swap-in may take: all of them on an idle pool."""
        return self.num_free_blocks - (self.watermark_blocks if self.seqs else 0)

    # -- admission -----------------------------------------------------------------------------
    def allocate_prompt(
        self, seqs: list[Sequence], num_new_tokens: Callable[[Sequence, int], int]
    ) -> list[PromptPlan] | None:
        """Admits waiting sequences holding no blocks, in order, all or none.

        Each takes the longest run of its leading full blocks found in the prefix cache, or
        written this step by an earlier sequence of the call (engine/prompt_hits.py).
        num_new_tokens(seq, num_computed_tokens) says how many tokens it computes this step: 0
        for the first means the group cannot be admitted now; 0 for a later one (the token
        budget ran out within a recomputed group) admits it holding only its hits, its tokens
        left to later steps. Returns the plans, or None.
        """
        for seq in seqs:
            assert not seq.block_table and seq.seq_id not in self.seqs
        planned = plan_prompt_hits(
            self.pool, self.block_size, self.enable_prefix_caching, seqs, num_new_tokens
        )
        if planned is None:
            return None
        plans, needed = planned
        if needed > self._num_admittable_blocks():
            return None
        # Planned hits are held before any block is handed out, so that no fresh allocation
        # evicts a cached block a later sequence of the group is about to share.
        for _, hits, _ in plans:
            for hit in hits:
                if isinstance(hit, Block):
                    self.pool.touch(hit)
        result = []
        for seq, hits, n in plans:
            table = []
            for hit in hits:
                if not isinstance(hit, Block):  # written by an earlier seq of this call
                    index, i = hit
                    hit = self.pool.blocks[plans[index].seq.block_table[i]]
                    self.pool.touch(hit)
                table.append(hit.block_id)
            if self.enable_prefix_caching:
                self.num_prefix_cache_queries += seq.num_tokens
                self.num_prefix_cache_hits += len(hits) * self.block_size
            seq.set_block_table(table)
            seq.num_cached_blocks = len(hits)
            self.seqs[seq.seq_id] = seq
            num_computed = len(hits) * self.block_size
            copies = self._append(seq, num_computed, n)
            assert not copies, "a fresh sequence's blocks are its own or read-only hits"
            result.append(PromptPlan(num_computed, n))
        return result

    # -- growth and copy-on-write ----------------------------------------------------------------
    def allocate_slots(
        self, seqs: list[Sequence], num_new_tokens: list[int]
    ) -> BlockMapping | None:
        """Makes room for each running sequence to write its next num_new_tokens tokens, all or
        none; returns the block copies to do first (copy-on-write), or None.

        A block that others share and this step writes into is replaced by a private copy.
        """
        for seq in seqs:
            assert seq.seq_id in self.seqs, seq
            if self.sliding_window is not None:
                self._free_out_of_window(seq)
        if len(seqs) == 1 and num_new_tokens[0] == 1 and self._append_decode(seqs[0]):
            return []
        needed = self._num_blocks_to_append(
            seqs, num_new_tokens, lambda block_id: self.pool.blocks[block_id].ref_count
        )
        if needed > self.num_free_blocks:
            return None
        copies: BlockMapping = []
        for seq, n in zip(seqs, num_new_tokens):
            if n:
                copies += self._append(seq, seq.num_computed_tokens, n)
        return copies

    def append_decode(self, seq: Sequence) -> bool:
        """allocate_slots([seq], [1]) where that takes no copy (and no sliding window frees
        blocks): returns True having made room, else False having changed nothing."""
        return self.sliding_window is None and self._append_decode(seq)

    def _append_decode(self, seq: Sequence) -> bool:
        """The decode fast path of allocate_slots([seq], [1]): writes the token, and returns True,
        when that takes no copy, only its own block or one fresh block at the end of its table.
        Exactly what _num_blocks_to_append and _append do then, without their loops."""
        table = seq.block_table
        i = seq.num_computed_tokens // self.block_size
        if i == len(table) and self.pool.num_free_blocks:
            table.append(self.pool.allocate().block_id)
        elif i >= len(table) or self.pool.blocks[table[i]].ref_count > 1:
            return False
        num_full_blocks = (seq.num_computed_tokens + 1) // self.block_size
        if num_full_blocks > seq.num_cached_blocks:  # the token fills a block
            self._cache_full_blocks(seq, num_full_blocks)
        return True

    def _num_blocks_to_append(
        self, seqs: list[Sequence], num_new_tokens: list[int], ref_count: Callable[[int], int]
    ) -> int:
        """Fresh blocks that writing each seq's next tokens takes, copies included, exactly as
        _append takes them in this order (a copy releases the shared block for the next seq)."""
        needed = 0
        released: Counter[int] = Counter()
        for seq, n in zip(seqs, num_new_tokens):
            if not n:
                continue
            first = seq.num_computed_tokens // self.block_size
            last = self.num_blocks_for(seq.num_computed_tokens + n)
            needed += max(0, last - len(seq.block_table))
            for block_id in seq.block_table[first:last]:
                if ref_count(block_id) - released[block_id] > 1:
                    needed += 1
                    released[block_id] += 1
        return needed

    def _free_out_of_window(self, seq: Sequence) -> None:
        """Frees the blocks that no query from seq.num_computed_tokens on can see, last first
        (the free queue then evicts a sequence's earlier blocks, likelier shared, later)."""
        num_skipped_tokens = seq.num_computed_tokens - self.sliding_window + 1
        for i in range(
            min(num_skipped_tokens // self.block_size, len(seq.block_table)) - 1, -1, -1
        ):
            if seq.block_table[i] == NULL_BLOCK:
                break
            self.pool.free(self.pool.blocks[seq.block_table[i]])
            seq.block_table[i] = NULL_BLOCK
            seq.num_synced_blocks = min(seq.num_synced_blocks, i)
            self.num_sliding_window_freed_blocks += 1

    def _append(self, seq: Sequence, num_computed_tokens: int, num_new_tokens: int) -> BlockMapping:
        end = num_computed_tokens + num_new_tokens
        copies: BlockMapping = []
        first = num_computed_tokens // self.block_size
        for i in range(first, min(len(seq.block_table), self.num_blocks_for(end))):
            block = self.pool.blocks[seq.block_table[i]]
            if block.ref_count > 1:
                fresh = self.pool.allocate()
                self.pool.free(block)
                seq.block_table[i] = fresh.block_id
                seq.num_synced_blocks = min(seq.num_synced_blocks, i)
                copies.append((block.block_id, fresh.block_id))
                seq.num_cached_blocks = min(seq.num_cached_blocks, i)
        while len(seq.block_table) < self.num_blocks_for(end):
            seq.block_table.append(self.pool.allocate().block_id)
        self._cache_full_blocks(seq, end // self.block_size)
        return copies

    def free_past_tokens(self, seq: Sequence) -> None:
        """Returns the blocks past seq's tokens: those its rejected draft tokens were written to
        (the block of its next token stays)."""
        table = seq.block_table
        keep = self.num_blocks_for(seq.num_tokens)
        while len(table) > keep:
            self.pool.free(self.pool.blocks[table.pop()])
        seq.num_synced_blocks = min(seq.num_synced_blocks, keep)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares every block of parent."""
        assert parent.seq_id in self.seqs and child.seq_id not in self.seqs
        for block_id in parent.block_table:
            if block_id != NULL_BLOCK:
                self.pool.touch(self.pool.blocks[block_id])
        child.set_block_table(list(parent.block_table))
        child.num_cached_blocks = parent.num_cached_blocks
        self.seqs[child.seq_id] = child

    def free(self, seq: Sequence) -> None:
        """Lets go of a sequence's blocks (device or CPU), last block first: the tail of a
        sequence is the least likely to be shared, so it is evicted first."""
        if self.seqs.pop(seq.seq_id, None) is not None:
            for block_id in reversed(seq.block_table):
                if block_id != NULL_BLOCK:
                    self.pool.free(self.pool.blocks[block_id])
        elif self.swapped.pop(seq.seq_id, None) is not None:
            for block_id in seq.block_table:
                if block_id != NULL_BLOCK:
                    self.cpu_pool.free(block_id)
        seq.set_block_table([])
        seq.num_cached_blocks = 0

    # -- prefix hashing ----------------------------------------------------------------------------
    def _cache_full_blocks(self, seq: Sequence, num_full_blocks: int) -> None:
        if not self.enable_prefix_caching or seq.num_cached_blocks >= num_full_blocks:
            return
        hashes = block_hashes(seq, self.block_size, num_full_blocks)
        num_full_blocks = len(hashes)  # fewer while a placeholder or drafts end the last one
        for i in range(seq.num_cached_blocks, num_full_blocks):
            if seq.block_table[i] != NULL_BLOCK:
                self.pool.cache(self.pool.blocks[seq.block_table[i]], hashes[i])
        seq.num_cached_blocks = num_full_blocks

    # -- invariants --------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """What must hold between any two calls, checked in full (tests and debugging: O(blocks)).
        Raises AssertionError unless ref counts, the free queue, the hash index and the CPU pool
        all agree with the block tables."""
        for seq in [*self.seqs.values(), *self.swapped.values()]:
            num_freed = seq.block_table.count(NULL_BLOCK)
            assert NULL_BLOCK not in seq.block_table[num_freed:], (
                f"{seq}: freed blocks not a prefix"
            )
            assert self.sliding_window is not None or not num_freed, seq
        for seq in self.seqs.values():
            assert not seq.is_finished, f"finished {seq} still holds blocks"
            held = [b for b in seq.block_table if b != NULL_BLOCK]
            assert len(set(held)) == len(held), f"{seq} repeats a block"
            assert len(seq.block_table) <= self.num_blocks_for(seq.num_tokens), seq
            assert seq.num_cached_blocks <= len(seq.block_table), seq
        assert not set(self.seqs) & set(self.swapped), "a sequence is on both sides"
        self.pool.check_integrity(
            Counter(b for seq in self.seqs.values() for b in seq.block_table if b != NULL_BLOCK)
        )
        self.cpu_pool.check_integrity(
            Counter(b for seq in self.swapped.values() for b in seq.block_table if b != NULL_BLOCK)
        )

    # Swap preemption (vLLM V0's swap space): a preempted group's blocks move to the CPU pool,
    # all or none, and come back when it resumes. A shared block moves once and stays shared:
    # its CPU copy is held by every sequence that held it.

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
