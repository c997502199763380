"""100,000 random block-manager operations, each followed by check_integrity() and a check of
the contents: a shadow of the cache (which token prefix each slot's K/V came from) is moved as
the runner would move blocks, and every sequence touched must read its own prefix, so a wrong
cached block, a copy-on-write from the wrong source or a swap to the wrong block fails."""

import random
from itertools import count

from pagedgen.core.block_manager import BlockManager
from pagedgen.core.sequence import Sequence
from pagedgen.sampling_params import SamplingParams
from tests.core.kv_shadow import KVShadow

NUM_OPERATIONS = 100_000
NUM_BLOCKS, NUM_CPU_BLOCKS = 48, 24


class Driver:
    """Plays the scheduler's part: admits, grows, forks, frees and swaps sequences at random.
    Prompts come from a few shared prefixes over a tiny vocabulary, so cache hits are common."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        block_size = self.rng.choice([1, 2, 4])
        self.bm = BlockManager(NUM_BLOCKS, block_size, NUM_CPU_BLOCKS, watermark=0.05)
        self.shadow = KVShadow(block_size, NUM_BLOCKS, NUM_CPU_BLOCKS)
        self.seq_ids = count()
        self.prefixes = [[self.rng.randrange(3) for _ in range(12)] for _ in range(3)]
        self.running: list[Sequence] = []
        self.swapped: list[list[Sequence]] = []
        self.counts = dict.fromkeys(
            ("allocate", "allocate_group", "append", "append_group", "fork", "free", "swap_out",
             "swap_in"), 0,
        )  # fmt: skip

    def new_seq(self, prompt: list[int]) -> Sequence:
        return Sequence(next(self.seq_ids), "r", prompt, SamplingParams())

    def allocate(self, num_seqs: int = 1) -> None:
        """Admits one sequence, or a group of siblings sharing a prompt (as after a recompute)."""
        prompt = self.rng.choice(self.prefixes)[: self.rng.randint(1, 12)]
        seqs = [
            self.new_seq(prompt + [self.rng.randrange(3) for _ in range(self.rng.randint(1, 6))])
            for _ in range(num_seqs)
        ]
        plans = self.bm.allocate_prompt(
            seqs, lambda seq, num_computed: seq.num_tokens - num_computed
        )
        if plans is None:
            return
        for seq, plan in zip(seqs, plans):
            self.shadow.write(seq, plan.num_computed_tokens, plan.num_new_tokens)
            seq.num_computed_tokens = seq.num_tokens
        for seq in seqs:
            self.shadow.check(seq, seq.num_tokens)
        self.running += seqs
        self.counts["allocate" if num_seqs == 1 else "allocate_group"] += 1

    def append(self, num_seqs: int = 1) -> None:
        seqs = self.rng.sample(self.running, min(num_seqs, len(self.running)))
        for seq in seqs:
            seq.append_token_id(self.rng.randrange(3))
        copies = self.bm.allocate_slots(seqs, [1] * len(seqs))
        if copies is None:
            for seq in seqs:
                seq.token_ids.pop()
                seq.output_token_ids.pop()
            return
        self.shadow.copy(copies)
        for seq in seqs:
            self.shadow.write(seq, seq.num_computed_tokens, 1)
            seq.num_computed_tokens += 1
        for seq in seqs:
            self.shadow.check(seq, seq.num_tokens)
        self.counts["append" if num_seqs == 1 else "append_group"] += 1

    def fork(self) -> None:
        parent = self.rng.choice(self.running)
        child = parent.fork(next(self.seq_ids))
        self.bm.fork(parent, child)
        self.running.append(child)
        self.counts["fork"] += 1

    def free(self) -> None:
        seq = self.running.pop(self.rng.randrange(len(self.running)))
        self.bm.free(seq)
        self.counts["free"] += 1

    def swap_out(self) -> None:
        group = self.rng.sample(self.running, self.rng.randint(1, min(3, len(self.running))))
        mapping = self.bm.swap_out(group)
        if mapping is not None:
            self.shadow.swap_out(mapping)
            self.running = [seq for seq in self.running if seq not in group]
            self.swapped.append(group)
            self.counts["swap_out"] += 1

    def swap_in(self) -> None:
        group = self.swapped[0]
        swapped_in = self.bm.swap_in(group, [0] * len(group))
        if swapped_in is not None:
            mapping, copies = swapped_in
            assert copies == []
            self.shadow.swap_in(mapping)
            for seq in group:
                self.shadow.check(seq, seq.num_computed_tokens)
            self.running += self.swapped.pop(0)
            self.counts["swap_in"] += 1

    def step(self) -> None:
        options = [self.allocate] * 3 + [lambda: self.allocate(self.rng.randint(2, 3))]
        if self.running:
            options += [self.append] * 6 + [self.free] * 2 + [self.fork, self.swap_out]
            options += [lambda: self.append(self.rng.randint(2, 3))] * 2
        if self.swapped:
            options += [self.swap_in] * 2
        if len(self.running) > 12:
            options = [self.free]
        self.rng.choice(options)()


def test_random_operations_never_break_integrity_or_contents():
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
        assert driver.bm.num_free_blocks == NUM_BLOCKS
        assert driver.bm.num_free_cpu_blocks == NUM_CPU_BLOCKS
