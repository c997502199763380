"""100,000 random block-manager operations, each followed by check_integrity()."""

import random

from pagedgen.engine.block_manager import BlockManager
from pagedgen.engine.sequence import Sequence
from pagedgen.sampling_params import SamplingParams

NUM_OPERATIONS = 100_000


class Driver:
    """Plays the scheduler's part: admits, grows, forks, frees and swaps sequences at random.
    Prompts come from a few shared prefixes over a tiny vocabulary, so cache hits are common."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.bm = BlockManager(
            num_blocks=48, block_size=self.rng.choice([1, 2, 4]), num_cpu_blocks=24, watermark=0.05
        )
        self.prefixes = [[self.rng.randrange(3) for _ in range(12)] for _ in range(3)]
        self.running: list[Sequence] = []
        self.swapped: list[list[Sequence]] = []
        self.counts = dict.fromkeys(
            ("allocate", "append", "fork", "free", "swap_out", "swap_in"), 0
        )

    def allocate(self) -> None:
        prompt = self.rng.choice(self.prefixes)[: self.rng.randint(1, 12)]
        seq = Sequence("r", prompt + [self.rng.randrange(3)], SamplingParams())
        cached = self.bm.find_cached_blocks(seq)
        n = seq.num_tokens - len(cached) * self.bm.block_size
        if self.bm.can_allocate([(seq, cached, n)]):
            self.bm.allocate(seq, cached, n)
            seq.num_computed_tokens = seq.num_tokens
            self.running.append(seq)
            self.counts["allocate"] += 1

    def append(self) -> None:
        seq = self.rng.choice(self.running)
        seq.append_token_id(self.rng.randrange(3))
        if self.bm.can_append_slots(seq, 1):
            self.bm.append_slots(seq, 1)
            seq.num_computed_tokens += 1
            self.counts["append"] += 1
        else:
            seq.token_ids.pop()
            seq.output_token_ids.pop()

    def fork(self) -> None:
        parent = self.rng.choice(self.running)
        child = parent.fork()
        self.bm.fork(parent, child)
        self.running.append(child)
        self.counts["fork"] += 1

    def free(self) -> None:
        seq = self.running.pop(self.rng.randrange(len(self.running)))
        self.bm.free(seq)
        self.counts["free"] += 1

    def swap_out(self) -> None:
        group = self.rng.sample(self.running, self.rng.randint(1, min(3, len(self.running))))
        if self.bm.can_swap_out(group):
            self.bm.swap_out(group)
            self.running = [seq for seq in self.running if seq not in group]
            self.swapped.append(group)
            self.counts["swap_out"] += 1

    def swap_in(self) -> None:
        group = self.swapped[0]
        if self.bm.can_swap_in(group):
            self.bm.swap_in(self.swapped.pop(0))
            self.running += group
            self.counts["swap_in"] += 1

    def step(self) -> None:
        options = [self.allocate] * 3
        if self.running:
            options += [self.append] * 6 + [self.free] * 2 + [self.fork, self.swap_out]
        if self.swapped:
            options += [self.swap_in] * 2
        if len(self.running) > 12:
            options = [self.free]
        self.rng.choice(options)()


def test_random_operations_never_break_integrity():
    drivers = [Driver(seed) for seed in range(4)]
    for i in range(NUM_OPERATIONS):
        driver = drivers[i % len(drivers)]
        driver.step()
        driver.bm.check_integrity()
    for driver in drivers:
        assert min(driver.counts.values()) > 100, driver.counts
        assert driver.bm.num_prefix_cache_hits > 0 and driver.bm.pool.num_evictions > 0
        for seq in driver.running + [s for group in driver.swapped for s in group]:
            driver.bm.free(seq)
        driver.bm.check_integrity()
        assert driver.bm.num_free_blocks == 48 and driver.bm.num_free_cpu_blocks == 24
