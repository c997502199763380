"""The scheduler's fast paths against its general ones: the same random workload (chunked
prefills, parallel samples, shared prefixes, preemptions by swap and by recompute) through the
engine loop, once as is and once with the block manager's decode fast path off and every step
laid out by the sort, schedules identical steps."""

import random

import pytest

from pagedgen.core import scheduler
from pagedgen.core.block_manager import BlockManager
from pagedgen.core.scheduler_output import ScheduledStep, SchedulerOutput
from pagedgen.core.sequence import Sequence
from pagedgen.sampling_params import SamplingParams
from tests.core.kv_shadow import run_step
from tests.core.scheduler.test_scheduler import make_engine

NUM_STEPS = 600


class SortedStep(ScheduledStep):
    """Lays out every step by the sort, as if a decode always followed a prefill chunk."""

    def output(self) -> SchedulerOutput:
        self._decode_after_prefill = True
        return super().output()


def summary(out: SchedulerOutput) -> tuple:
    return (
        [seq.seq_id for seq in out.seqs],
        out.num_computed_tokens,
        out.num_new_tokens,
        out.num_decode_seqs,
        [seq.seq_id for seq in out.sample_seqs],
        out.sample_rows,
        [group.request_id for group in out.preempted],
        out.blocks_to_swap_out,
        out.blocks_to_swap_in,
        out.blocks_to_copy,
    )


def run(seed: int, mode: str) -> list[tuple]:
    """Every step's summary."""
    rng = random.Random(seed)
    engine = make_engine(
        num_blocks=40, block_size=4, max_num_seqs=6, max_batched=32, mode=mode, num_cpu_blocks=48
    )
    prefixes = [[rng.randrange(5) for _ in range(30)] for _ in range(3)]
    steps = []
    for i in range(NUM_STEPS):
        if rng.random() < 0.5:
            prompt = rng.choice(prefixes)[: rng.randint(1, 30)] + [rng.randrange(5)]
            params = SamplingParams(
                max_tokens=rng.randint(1, 40), n=rng.choice([1, 1, 2, 3]), seed=0, detokenize=False
            )
            engine.add_request(f"{seed}-{i}", prompt, params)
        out = run_step(engine)
        if out is not None:
            steps.append(summary(out))
    return steps


@pytest.mark.parametrize("mode", ["auto", "recompute"])
@pytest.mark.parametrize("seed", range(3))
def test_fast_paths_schedule_as_the_general_paths(seed: int, mode: str, monkeypatch):
    fast = run(seed, mode)
    monkeypatch.setattr(BlockManager, "_append_decode", lambda self, seq: False)
    monkeypatch.setattr(scheduler, "ScheduledStep", SortedStep)
    general = run(seed, mode)
    assert fast == general
    num_preempted = sum(bool(step[6]) for step in fast)
    num_mixed = sum(0 < step[3] < len(step[0]) for step in fast)  # decodes and prefills
    assert num_preempted > 5 and num_mixed > 20, (num_preempted, num_mixed)


@pytest.mark.parametrize("fast", [False, True])
def test_a_decode_after_a_prefill_chunk_moves_first(fast: bool):
    seqs = [Sequence(i, "r", [1, 2, 3, 4], SamplingParams()) for i in range(4)]
    for seq in seqs[::2]:
        seq.num_computed_tokens = 3
    step = ScheduledStep(budget=100)
    add_decode = step.add_decode if fast else lambda seq: step.add(seq, 3, 1)
    add_decode(seqs[0])
    step.add(seqs[1], 0, 2)  # prefill chunk, samples nothing
    add_decode(seqs[2])
    step.add(seqs[3], 1, 3)  # last prefill chunk
    assert step.budget == 100 - 7 and step.end(seqs[2]) == 4
    out = step.output()
    assert out.seqs == [seqs[0], seqs[2], seqs[1], seqs[3]] and out.num_decode_seqs == 2
    assert out.num_computed_tokens == [3, 3, 0, 1] and out.num_new_tokens == [1, 1, 2, 3]
    assert out.sample_seqs == [seqs[0], seqs[2], seqs[3]] and out.sample_rows == [0, 1, 3]
