"""BlockManager.allocate_slots' decode fast path (_append_decode) against its general path: the
same random operations (the Driver of test_random_operations.py) through a block
manager with the fast path and one without leave identical copies, block tables, sync marks,
free queues, prefix caches and CPU pools after every operation."""

import pytest

from pagedgen.core.block_manager import BlockManager, BlockMapping
from pagedgen.core.sequence import Sequence
from tests.core.block_manager.test_random_operations import NUM_BLOCKS, NUM_CPU_BLOCKS, Driver

NUM_OPERATIONS = 10_000


class Recording(BlockManager):
    """Records every allocate_slots result and how many decodes took the fast path."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.results: list[BlockMapping | None] = []
        self.num_fast_decodes = 0

    def allocate_slots(self, seqs: list[Sequence], num_new_tokens: list[int]):
        result = super().allocate_slots(seqs, num_new_tokens)
        self.results.append(None if result is None else list(result))
        return result

    def _append_decode(self, seq: Sequence) -> bool:
        taken = super()._append_decode(seq)
        self.num_fast_decodes += taken
        return taken


class GeneralPathOnly(Recording):
    def _append_decode(self, seq: Sequence) -> bool:
        return False


class NoShadow:
    """Stands in for the KV shadow under a sliding window, whose freed blocks it would check."""

    def __getattr__(self, name: str):
        return lambda *args: None


def make_driver(seed: int, manager: type[Recording], sliding_window: int | None) -> Driver:
    driver = Driver(seed)
    block_size = driver.bm.block_size
    driver.bm = manager(
        NUM_BLOCKS, block_size, NUM_CPU_BLOCKS, watermark=0.05, sliding_window=sliding_window
    )
    if sliding_window is not None:
        driver.shadow = NoShadow()
    return driver


def state(driver: Driver) -> tuple:
    bm = driver.bm
    seqs = sorted([*bm.seqs.values(), *bm.swapped.values()], key=lambda seq: seq.seq_id)
    return (
        [(s.seq_id, s.block_table, s.num_synced_blocks, s.num_cached_blocks) for s in seqs],
        [block.block_id for block in bm.pool.free_queue],
        {block_hash: block.block_id for block_hash, block in bm.pool.cached.items()},
        bm.cpu_pool.free_block_ids,
        bm.pool.num_evictions,
        bm.num_sliding_window_freed_blocks,
        bm.results,
        driver.counts,
    )


@pytest.mark.parametrize("sliding_window", [None, 3, 7])
@pytest.mark.parametrize("seed", range(2))
def test_fast_path_decides_as_the_general_path(seed: int, sliding_window: int | None):
    fast = make_driver(seed, Recording, sliding_window)
    general = make_driver(seed, GeneralPathOnly, sliding_window)
    for _ in range(NUM_OPERATIONS):
        for driver in (fast, general):
            driver.step()
            driver.bm.check_integrity()
        assert state(fast) == state(general)
        for driver in (fast, general):  # as the runner syncs: the next rewrite must lower it
            driver.bm.results.clear()
            for seq in driver.bm.seqs.values():
                seq.num_synced_blocks = len(seq.block_table)
    assert fast.bm.num_fast_decodes > 1000 and general.bm.num_fast_decodes == 0
    assert fast.counts["append"] > 1000 and fast.bm.pool.num_evictions > 0
