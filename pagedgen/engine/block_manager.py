from collections import Counter
from collections.abc import Hashable

from pagedgen.engine.block_pool import Block, BlockPool
from pagedgen.engine.sequence import Sequence

BlockMapping = list[tuple[int, int]]  # (source block id, destination block id)


class BlockManager:
    """Maps sequences to KV-cache blocks; plain Python, no torch.

    Logical block i of a sequence lives in physical block seq.block_table[i]. A block is taken
    only when a sequence crosses a block boundary and returned when its last holder lets go;
    blocks are shared by reference count (prefix-cache hits, forked samples and beams) and
    copied on write. Sequences swapped out hold blocks of the CPU pool instead.

    Prefix caching indexes every full block by a chained hash of its tokens, registered when the
    step that computes it is scheduled; a step writes K/V before any attention reads them, so a
    sequence scheduled in the same step may already attend to them.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_cpu_blocks: int = 0,
        enable_prefix_caching: bool = True,
        watermark: float = 0.01,
    ) -> None:
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = int(watermark * num_blocks)
        self.pool = BlockPool(num_blocks)
        self.num_cpu_blocks = num_cpu_blocks
        self.cpu_free_block_ids = list(range(num_cpu_blocks - 1, -1, -1))
        self.cpu_ref_counts = [0] * num_cpu_blocks
        self.seqs: dict[int, Sequence] = {}  # holding device blocks
        self.swapped: dict[int, Sequence] = {}  # holding CPU blocks
        self.num_prefix_cache_queries = 0  # tokens looked up
        self.num_prefix_cache_hits = 0  # tokens found

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
        return len(self.cpu_free_block_ids)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def fits_in_pool(self, num_tokens: int) -> bool:
        return self.num_blocks_for(num_tokens) <= self.num_blocks

    # -- admission -----------------------------------------------------------------------------
    def find_cached_blocks(self, seq: Sequence) -> list[Block]:
        """The longest run of leading full blocks already in the cache. At least one token is
        always left to compute, so that the step yields logits for it."""
        if not self.enable_prefix_caching:
            return []
        num_full = (seq.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in self._block_hashes(seq, num_full):
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def can_allocate(self, plans: list[tuple[Sequence, list[Block], int]]) -> bool:
        """Whether every (seq, cached blocks, num_new_tokens) of a group can be allocated."""
        # Reviving a free cached block takes it off the free queue like an allocation does. The
        # watermark keeps room for running sequences to grow into; an idle pool skips it.
        needed = 0
        for _, cached, num_new_tokens in plans:
            needed += self.num_blocks_for(num_new_tokens)  # cached blocks end on a boundary
            needed += sum(1 for block in cached if block.ref_count == 0)
        watermark = self.watermark_blocks if self.seqs else 0
        return needed <= self.num_free_blocks - watermark

    def allocate(self, seq: Sequence, cached: list[Block], num_new_tokens: int) -> None:
        """Gives a waiting sequence its cached blocks and fresh ones for num_new_tokens more."""
        assert not seq.block_table and seq.seq_id not in self.seqs
        if self.enable_prefix_caching:
            self.num_prefix_cache_queries += seq.num_tokens
            self.num_prefix_cache_hits += len(cached) * self.block_size
        for block in cached:
            self.pool.touch(block)
        seq.block_table = [block.block_id for block in cached]
        seq.num_cached_blocks = len(cached)
        seq.num_computed_tokens = len(cached) * self.block_size
        self.seqs[seq.seq_id] = seq
        self.append_slots(seq, num_new_tokens)

    # -- growth and copy-on-write ----------------------------------------------------------------
    def num_needed_blocks(self, seq: Sequence, num_new_tokens: int) -> int:
        """Fresh blocks that writing tokens num_computed..+num_new_tokens takes, copies included."""
        end = seq.num_computed_tokens + num_new_tokens
        needed = max(0, self.num_blocks_for(end) - len(seq.block_table))
        first = seq.num_computed_tokens // self.block_size
        for block_id in seq.block_table[first : self.num_blocks_for(end)]:
            needed += self.pool.blocks[block_id].ref_count > 1
        return needed

    def can_append_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.num_needed_blocks(seq, num_new_tokens) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> BlockMapping:
        """Makes room to write num_new_tokens more tokens; returns the block copies to do first.

        A block that others share and this step writes into is replaced by a private copy.
        """
        assert seq.seq_id in self.seqs
        end = seq.num_computed_tokens + num_new_tokens
        copies: BlockMapping = []
        first = seq.num_computed_tokens // self.block_size
        for i in range(first, min(len(seq.block_table), self.num_blocks_for(end))):
            block = self.pool.blocks[seq.block_table[i]]
            if block.ref_count > 1:
                fresh = self.pool.allocate()
                self.pool.free(block)
                seq.block_table[i] = fresh.block_id
                copies.append((block.block_id, fresh.block_id))
                seq.num_cached_blocks = min(seq.num_cached_blocks, i)
        while len(seq.block_table) < self.num_blocks_for(end):
            seq.block_table.append(self.pool.allocate().block_id)
        self._cache_full_blocks(seq, end // self.block_size)
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares every block of parent."""
        assert parent.seq_id in self.seqs and child.seq_id not in self.seqs
        for block_id in parent.block_table:
            self.pool.touch(self.pool.blocks[block_id])
        child.block_table = list(parent.block_table)
        child.num_cached_blocks = parent.num_cached_blocks
        self.seqs[child.seq_id] = child

    def free(self, seq: Sequence) -> None:
        """Lets go of a sequence's blocks (device or CPU), last block first: the tail of a
        sequence is the least likely to be shared, so it is evicted first."""
        if self.seqs.pop(seq.seq_id, None) is not None:
            for block_id in reversed(seq.block_table):
                self.pool.free(self.pool.blocks[block_id])
        elif self.swapped.pop(seq.seq_id, None) is not None:
            for block_id in seq.block_table:
                self._free_cpu_block(block_id)
        seq.block_table = []
        seq.num_cached_blocks = 0

    # -- swapping --------------------------------------------------------------------------------
    def can_swap_out(self, seqs: list[Sequence]) -> bool:
        return len(_unique_blocks(seqs)) <= self.num_free_cpu_blocks

    def swap_out(self, seqs: list[Sequence]) -> BlockMapping:
        """Moves the sequences' blocks to the CPU pool, shared blocks once; all or nothing."""
        assert self.can_swap_out(seqs) and all(seq.seq_id in self.seqs for seq in seqs)
        tables = [list(seq.block_table) for seq in seqs]
        mapping = {block_id: self.cpu_free_block_ids.pop() for block_id in _unique_blocks(seqs)}
        for seq, table in zip(seqs, tables):
            self.free(seq)
            seq.block_table = [mapping[block_id] for block_id in table]
            for cpu_block_id in seq.block_table:
                self.cpu_ref_counts[cpu_block_id] += 1
            self.swapped[seq.seq_id] = seq
        return list(mapping.items())

    def can_swap_in(self, seqs: list[Sequence]) -> bool:
        needed = len(_unique_blocks(seqs)) + len(seqs)  # + room for each one's next token
        return needed <= self.num_free_blocks - self.watermark_blocks

    def swap_in(self, seqs: list[Sequence]) -> BlockMapping:
        assert all(seq.seq_id in self.swapped for seq in seqs)
        holders = Counter(cpu_id for seq in seqs for cpu_id in seq.block_table)
        mapping = {}
        for cpu_id, num_holders in holders.items():
            block = self.pool.allocate()
            block.ref_count = num_holders
            mapping[cpu_id] = block.block_id
        for seq in seqs:
            cpu_table = seq.block_table
            self.free(seq)
            seq.block_table = [mapping[cpu_id] for cpu_id in cpu_table]
            self.seqs[seq.seq_id] = seq
        return list(mapping.items())

    def _free_cpu_block(self, block_id: int) -> None:
        self.cpu_ref_counts[block_id] -= 1
        if self.cpu_ref_counts[block_id] == 0:
            self.cpu_free_block_ids.append(block_id)

    # -- prefix hashing ----------------------------------------------------------------------------
    def _block_hashes(self, seq: Sequence, num_full_blocks: int) -> list[Hashable]:
        """Extends seq.block_hashes to num_full_blocks: hash i is (hash of block i - 1, tokens)."""
        size = self.block_size
        hashes = seq.block_hashes
        for i in range(len(hashes), num_full_blocks):
            parent = hash(hashes[-1]) if hashes else None
            hashes.append((parent, tuple(seq.token_ids[i * size : (i + 1) * size])))
        return hashes[:num_full_blocks]

    def _cache_full_blocks(self, seq: Sequence, num_full_blocks: int) -> None:
        if not self.enable_prefix_caching or seq.num_cached_blocks >= num_full_blocks:
            return
        hashes = self._block_hashes(seq, num_full_blocks)
        for i in range(seq.num_cached_blocks, num_full_blocks):
            self.pool.cache(self.pool.blocks[seq.block_table[i]], hashes[i])
        seq.num_cached_blocks = num_full_blocks

    # -- invariants --------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raises AssertionError unless ref counts, the free queue, the hash index and the CPU
        pool all agree with the block tables."""
        holders = Counter(b for seq in self.seqs.values() for b in seq.block_table)
        for seq in self.seqs.values():
            assert not seq.is_finished, f"finished {seq} still holds blocks"
            assert len(set(seq.block_table)) == len(seq.block_table), f"{seq} repeats a block"
            assert len(seq.block_table) <= self.num_blocks_for(seq.num_tokens), seq
            assert seq.num_cached_blocks <= len(seq.block_table), seq
        free_ids = [block.block_id for block in self.pool.free_queue]
        assert len(free_ids) == len(set(free_ids)) == self.pool.num_free_blocks
        for block in self.pool.blocks:
            assert block.ref_count == holders[block.block_id], (
                f"{block} is held by {holders[block.block_id]} tables"
            )
            assert (block.ref_count == 0) == (block.prev is not None), f"{block} free-queue link"
        assert len(free_ids) + len(holders) == self.num_blocks
        for block_hash, block in self.pool.cached.items():
            assert block.block_hash == block_hash, f"{block} indexed under another hash"
        indexed = [b for b in self.pool.blocks if b.block_hash is not None]
        assert len(indexed) == len(self.pool.cached), "a hashed block is missing from the index"
        cpu_holders = Counter(b for seq in self.swapped.values() for b in seq.block_table)
        assert not set(self.seqs) & set(self.swapped), "a sequence is on both sides"
        for cpu_id in range(self.num_cpu_blocks):
            assert self.cpu_ref_counts[cpu_id] == cpu_holders[cpu_id], f"CPU block {cpu_id}"
        assert len(set(self.cpu_free_block_ids)) == len(self.cpu_free_block_ids)
        assert set(self.cpu_free_block_ids).isdisjoint(cpu_holders)
        assert len(self.cpu_free_block_ids) + len(cpu_holders) == self.num_cpu_blocks


def _unique_blocks(seqs: list[Sequence]) -> list[int]:
    return list(dict.fromkeys(block_id for seq in seqs for block_id in seq.block_table))
