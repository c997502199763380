from collections import Counter
from collections.abc import Hashable

NULL_BLOCK = -1  # a block table entry whose block was freed: before every layer's window
BlockMapping = list[tuple[int, int]]  # (source block id, destination block id)


class Block:
    """One KV-cache block. prev/next link it into the free queue while its ref_count is 0."""

    __slots__ = ("block_id", "ref_count", "block_hash", "prev", "next")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: Hashable | None = None
        self.prev: Block | None = None
        self.next: Block | None = None

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref_count={self.ref_count}, hash={self.block_hash})"


class FreeBlockQueue:
    """Doubly linked list of free blocks in eviction order, as vLLM's FreeKVCacheBlockQueue.

    Freed blocks join the tail and allocation takes the head, so the block freed longest ago is
    evicted first; a cached block revived by a prefix hit is unlinked from the middle. All O(1).
    """

    def __init__(self, blocks: list[Block]) -> None:
        self.head = Block(-1)  # sentinels: head.next is the first free block, tail.prev the last
        self.tail = Block(-1)
        self.head.next, self.tail.prev = self.tail, self.head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self):
        block = self.head.next
        while block is not self.tail:
            yield block
            block = block.next

    def popleft(self) -> Block:
        block = self.head.next
        assert block is not self.tail, "no free block"
        self.remove(block)
        return block

    def append(self, block: Block) -> None:
        assert block.prev is None and block.next is None, f"{block} is already queued"
        last = self.tail.prev
        last.next, block.prev, block.next, self.tail.prev = block, last, self.tail, block
        self.num_free_blocks += 1

    def remove(self, block: Block) -> None:
        block.prev.next, block.next.prev = block.next, block.prev
        block.prev = block.next = None
        self.num_free_blocks -= 1


class BlockPool:
    """The device's blocks: ref counts, the free queue, and the index of cached full blocks.

    A block is free iff its ref_count is 0. A freed block keeps its hash and contents while it
    waits in the free queue, so a later prefix hit can revive it; the hash is dropped only when
    the block is handed out again (evicted).
    """

    def __init__(self, num_blocks: int) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[Hashable, Block] = {}
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def allocate(self) -> Block:
        block = self.free_queue.popleft()
        if block.block_hash is not None:
            del self.cached[block.block_hash]
            block.block_hash = None
            self.num_evictions += 1
        block.ref_count = 1
        return block

    def touch(self, block: Block) -> None:
        """Takes one more reference, reviving the block if it was free."""
        if block.ref_count == 0:
            self.free_queue.remove(block)
        block.ref_count += 1

    def free(self, block: Block) -> None:
        assert block.ref_count > 0, f"{block} freed twice"
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_queue.append(block)

    def lookup(self, block_hash: Hashable) -> Block | None:
        return self.cached.get(block_hash)

    def cache(self, block: Block, block_hash: Hashable) -> None:
        """Indexes a full, computed block; a hash already indexed keeps its first block."""
        if block.block_hash is None and block_hash not in self.cached:
            block.block_hash = block_hash
            self.cached[block_hash] = block

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached block, as vLLM's reset_prefix_cache; only while no block is in
        use (a running sequence's blocks stay indexed otherwise). Returns whether it did."""
        if self.num_free_blocks != len(self.blocks):
            return False
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
        return True

    def check_integrity(self, holders: Counter[int]) -> None:
        """Raises AssertionError unless the ref counts equal holders (block id -> block tables
        holding it) and the free queue and the hash index agree with them."""
        free_ids = [block.block_id for block in self.free_queue]
        assert len(free_ids) == len(set(free_ids)) == self.num_free_blocks
        for block in self.blocks:
            assert block.ref_count == holders[block.block_id], (
                f"{block} is held by {holders[block.block_id]} tables"
            )
            assert (block.ref_count == 0) == (block.prev is not None), f"{block} free-queue link"
        assert len(free_ids) + len(holders) == len(self.blocks)
        for block_hash, block in self.cached.items():
            assert block.block_hash == block_hash, f"{block} indexed under another hash"
        indexed = [b for b in self.blocks if b.block_hash is not None]
        assert len(indexed) == len(self.cached), "a hashed block is missing from the index"


class CpuBlockPool:
    """The swap pool on the CPU: ref counts and free block ids; no prefix cache."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free_block_ids = list(range(num_blocks - 1, -1, -1))
        self.ref_counts = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    def allocate(self) -> int:
        """A free block; its holders take it with hold()."""
        return self.free_block_ids.pop()

    def hold(self, block_id: int) -> None:
        self.ref_counts[block_id] += 1

    def free(self, block_id: int) -> None:
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            self.free_block_ids.append(block_id)

    def check_integrity(self, holders: Counter[int]) -> None:
        for block_id, num_holders in holders.items():
            assert self.ref_counts[block_id] == num_holders, f"CPU block {block_id}"
        # Every other block's count is 0 (list.count runs in C: a tiny model's pool has millions).
        assert self.ref_counts.count(0) == self.num_blocks - len(holders), "a stray CPU ref count"
        free = set(self.free_block_ids)
        assert len(free) == len(self.free_block_ids)
        assert free.isdisjoint(holders)
        assert len(self.free_block_ids) + len(holders) == self.num_blocks
