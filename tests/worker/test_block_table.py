"""The runner's persistent block tables (BlockTables) against the block manager's own: random
block-manager operations, rows synced for random subsets, and the step inputs the runner builds
from them against a direct construction from the sequences."""

import random

import pytest
import torch

from pagedgen.core.block_manager import NULL_BLOCK, BlockManager
from pagedgen.core.scheduler import Scheduler
from pagedgen.core.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedgen.sampling_params import SamplingParams
from pagedgen.worker.block_table import BlockTables
from pagedgen.worker.model_runner import ModelRunner
from tests.core.block_manager.test_random_operations import Driver


def expected_row(seq: Sequence, width: int) -> list[int]:
    return seq.block_table + [0] * (width - len(seq.block_table))


def test_rows_follow_the_block_manager_through_random_operations():
    for seed in range(3):
        driver = Driver(seed)
        tables = BlockTables(num_rows=2, max_num_blocks_per_seq=64)
        rng = random.Random(seed)
        for _ in range(6_000):
            driver.step()
            swapped = {seq for group in driver.swapped for seq in group}
            for seq in driver.running:
                seq.status = SequenceStatus.RUNNING
            for seq in swapped:
                seq.status = SequenceStatus.SWAPPED
            step = rng.sample(driver.running, rng.randint(0, len(driver.running)))
            rows = tables.sync(step)
            assert len(set(rows.tolist())) == len(step)
            for seq, row in zip(step, rows):
                assert tables.table[row].tolist() == expected_row(seq, 64), seq
        assert tables.table.shape[0] > 2  # grew past its first rows
        assert driver.counts["swap_in"] > 10 and driver.counts["fork"] > 10


def test_a_step_writes_only_what_changed(monkeypatch):
    bm = BlockManager(num_blocks=64, block_size=4)
    seqs = [Sequence(i, "r", list(range(i, i + 10)), SamplingParams()) for i in range(3)]
    assert bm.allocate_prompt(seqs, lambda seq, done: seq.num_tokens - done) is not None
    tables = BlockTables(num_rows=4, max_num_blocks_per_seq=8)
    written: list[int] = []
    original = tables._write
    monkeypatch.setattr(
        tables, "_write", lambda row, start, ids: (written.extend(ids), original(row, start, ids))
    )
    tables.sync(seqs)
    assert len(written) == 9  # three blocks each, once
    written.clear()
    tables.sync(seqs)
    assert written == []
    for seq in seqs:  # 10 -> 13 tokens stays in block 2; the 14th opens block 3
        seq.num_computed_tokens = seq.num_tokens
        for _ in range(4):
            seq.append_token_id(0)
            assert bm.allocate_slots([seq], [1]) is not None
            seq.num_computed_tokens += 1
    tables.sync(seqs)
    assert len(written) == 3
    assert [tables.table[row, 3] for row in tables.sync(seqs)] == [s.block_table[3] for s in seqs]


def test_copy_on_write_and_window_frees_rewrite_the_row():
    bm = BlockManager(num_blocks=32, block_size=2, sliding_window=4)
    parent = Sequence(0, "r", [1, 2, 3], SamplingParams())
    assert bm.allocate_prompt([parent], lambda seq, done: seq.num_tokens - done) is not None
    parent.num_computed_tokens = 3
    child = parent.fork(1)
    bm.fork(parent, child)
    tables = BlockTables(num_rows=2, max_num_blocks_per_seq=16)
    tables.sync([parent, child])
    child.append_token_id(9)
    assert bm.allocate_slots([child], [1]) == [(parent.block_table[1], child.block_table[1])]
    child.num_computed_tokens += 1
    for _ in range(6):  # grows past the window: its first blocks become NULL_BLOCK
        child.append_token_id(9)
        assert bm.allocate_slots([child], [1]) is not None
        child.num_computed_tokens += 1
    assert child.block_table[0] == NULL_BLOCK
    rows = tables.sync([parent, child])
    assert tables.table[rows[0]].tolist() == expected_row(parent, 16)
    assert tables.table[rows[1]].tolist() == expected_row(child, 16)


def test_a_table_longer_than_the_rows_is_an_error():
    tables = BlockTables(num_rows=1, max_num_blocks_per_seq=2)
    seq = Sequence(0, "r", [1], SamplingParams())
    seq.block_table = [1, 2, 3]
    with pytest.raises(ValueError, match="max_num_blocks_per_seq"):
        tables.sync([seq])


def reference_inputs(scheduled, block_size: int) -> dict[str, list]:
    """The step's inputs built directly from the sequences, one token at a time."""
    ids, positions, slots, context_lens, cu = [], [], [], [], [0]
    for i, (seq, start, n) in enumerate(
        zip(scheduled.seqs, scheduled.num_computed_tokens, scheduled.num_new_tokens)
    ):
        for p in range(start, start + n):
            ids.append(seq.token_ids[p])
            positions.append(p)
            slots.append(seq.block_table[p // block_size] * block_size + p % block_size)
        context_lens.append(start + n)
        cu.append(cu[-1] + n)
        if i < scheduled.num_decode_seqs:
            assert n == 1 and ids[-1] == seq.last_token_id
    return dict(ids=ids, positions=positions, slots=slots, context_lens=context_lens, cu=cu)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_step_inputs_equal_a_direct_construction(block_size):
    rng = random.Random(block_size)
    bm = BlockManager(num_blocks=300, block_size=block_size, num_cpu_blocks=100)
    scheduler = Scheduler(bm, max_num_seqs=12, max_num_batched_tokens=48, max_model_len=256)
    runner = ModelRunner(
        None, None, None, block_size, torch.device("cpu"), torch.float32, max_model_len=256,
        max_num_seqs=2,
    )  # fmt: skip
    prefixes = [[rng.randrange(50) for _ in range(40)] for _ in range(2)]
    num_steps = num_mixed = 0
    for i in range(60):
        prompt = rng.choice(prefixes)[: rng.randint(1, 40)] + [rng.randrange(50)] * rng.randint(
            1, 30
        )
        params = SamplingParams(max_tokens=rng.randint(1, 40), n=rng.choice([1, 1, 2]))
        scheduler.add(SequenceGroup(str(i), scheduler.new_sequence(str(i), prompt, params), params))
    while scheduler.has_unfinished():
        scheduled = scheduler.schedule()
        inputs = runner.prepare(scheduled)
        ref = reference_inputs(scheduled, block_size)
        md = inputs.metadata
        assert inputs.input_ids.tolist() == ref["ids"]
        assert inputs.positions.tolist() == ref["positions"]
        assert md.slot_mapping.tolist() == ref["slots"]
        assert md.context_lens.tolist() == md.context_lens_cpu == ref["context_lens"]
        assert md.cu_seqlens_q.tolist() == ref["cu"]
        assert inputs.last_rows == [end - 1 for end in ref["cu"][1:]]
        for seq, row, n in zip(scheduled.seqs, md.block_tables.tolist(), ref["context_lens"]):
            num_blocks = -(-n // block_size)
            assert row[:num_blocks] == seq.block_table[:num_blocks]
        assert md.block_tables.shape[1] == -(-max(ref["context_lens"]) // block_size)
        num_steps += 1
        num_mixed += 0 < scheduled.num_decode_seqs < len(scheduled.seqs)
        for seq in scheduled.sample_seqs:  # the engine's part: a token, and the stop rule
            seq.append_token_id(rng.randrange(50))
            if seq.num_output_tokens >= seq.sampling_params.max_tokens:
                seq.finish(SequenceStatus.FINISHED_LENGTH_CAPPED)
                scheduler.finish(seq)
        scheduler.remove_finished_groups()
    assert num_steps > 20 and num_mixed > 5
