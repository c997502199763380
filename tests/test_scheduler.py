from pagedgen.engine.block_manager import BlockManager
from pagedgen.engine.scheduler import PreemptionMode, Scheduler
from pagedgen.engine.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedgen.sampling_params import SamplingParams


def make_scheduler(
    num_blocks=64,
    block_size=4,
    max_num_seqs=8,
    max_batched=64,
    max_len=256,
    chunked=True,
    mode=None,
    num_cpu_blocks=0,
    caching=True,
):
    bm = BlockManager(num_blocks, block_size, num_cpu_blocks, caching, watermark=0.0)
    return Scheduler(bm, max_num_seqs, max_batched, max_len, chunked, mode)


_next_token = iter(range(1000, 10**9))


def make_group(num_prompt_tokens: int, max_tokens: int = 8, n: int = 1) -> SequenceGroup:
    params = SamplingParams(max_tokens=max_tokens, n=n, seed=0)
    # distinct tokens per group, so prefix caching never links two test groups by accident
    prompt = [next(_next_token) for _ in range(num_prompt_tokens)]
    return SequenceGroup("r", Sequence("r", prompt, params), params)


def run_step(scheduler: Scheduler):
    """Pretends the model ran: scheduled tokens are computed, and each sequence whose prompt is
    complete samples one token."""
    out = scheduler.schedule()
    for seq, num_new in zip(out.seqs, out.num_new_tokens):
        seq.num_computed_tokens += num_new
    for seq in out.seqs:
        if seq.num_computed_tokens == seq.num_tokens:
            seq.append_token_id(7)
            if seq.num_output_tokens >= seq.sampling_params.max_tokens:
                seq.finish(SequenceStatus.FINISHED_LENGTH_CAPPED)
                scheduler.finish(seq)
    scheduler.remove_finished_groups()
    scheduler.block_manager.check_integrity()
    return out


def test_fcfs_admission_and_running_first():
    s = make_scheduler()
    groups = [make_group(5) for _ in range(3)]
    for group in groups:
        assert s.add(group) is None
    out = run_step(s)
    assert out.seqs == [g.seqs[0] for g in groups] and out.num_new_tokens == [5, 5, 5]
    late = make_group(3)
    s.add(late)
    out = run_step(s)
    assert out.seqs == [g.seqs[0] for g in groups] + [late.seqs[0]]
    assert out.num_new_tokens == [1, 1, 1, 3]


def test_max_num_seqs_and_token_budget_without_chunking():
    s = make_scheduler(max_num_seqs=2, max_batched=10, chunked=False)
    groups = [make_group(4, max_tokens=2) for _ in range(4)]
    for group in groups:
        s.add(group)
    assert len(s.schedule().seqs) == 2  # max_num_seqs
    s2 = make_scheduler(max_num_seqs=8, max_batched=10, chunked=False)
    for group in [make_group(4, max_tokens=2) for _ in range(4)]:
        s2.add(group)
    assert s2.schedule().num_new_tokens == [4, 4]  # a third would exceed 10 tokens


def test_chunked_prefill_splits_a_long_prompt_and_decodes_go_first():
    s = make_scheduler(max_batched=16)
    short = make_group(3, max_tokens=20)
    s.add(short)
    run_step(s)
    long_ = make_group(40)
    s.add(long_)
    chunks = []
    while long_.seqs[0].num_output_tokens == 0:
        out = run_step(s)
        assert out.seqs[0] is short.seqs[0] and out.num_new_tokens[0] == 1
        assert out.num_batched_tokens <= 16
        chunks.append(out.num_new_tokens[1])
    assert chunks == [15, 15, 10]


def test_continuous_batching_joins_and_leaves_every_step():
    s = make_scheduler(max_num_seqs=2)
    short, long_, waiting = make_group(4, 2), make_group(4, 6), make_group(4)
    for group in (short, long_, waiting):
        s.add(group)
    assert run_step(s).seqs == [short.seqs[0], long_.seqs[0]]
    assert run_step(s).seqs == [short.seqs[0], long_.seqs[0]]  # short finishes here
    assert short.is_finished and short.seqs[0].block_table == []
    assert run_step(s).seqs == [long_.seqs[0], waiting.seqs[0]]  # joins at once


def test_preempts_most_recent_by_recompute_and_output_survives():
    s = make_scheduler(num_blocks=6, block_size=4, max_num_seqs=4, caching=False)
    first, second = make_group(8, max_tokens=12), make_group(8, max_tokens=12)
    s.add(first)
    s.add(second)
    while not s.num_preemptions[PreemptionMode.RECOMPUTE]:
        run_step(s)
    seq = second.seqs[0]
    assert seq.status == SequenceStatus.WAITING and seq.num_computed_tokens == 0
    assert seq.block_table == [] and seq.num_output_tokens > 0
    assert first.seqs[0].status == SequenceStatus.RUNNING
    while not first.is_finished:
        run_step(s)
    out = s.schedule()
    assert out.seqs == [seq]  # recomputed: prompt and the tokens generated so far
    assert out.num_new_tokens == [seq.num_tokens]


def test_parallel_samples_fork_at_the_end_of_the_prompt_and_swap_as_a_group():
    s = make_scheduler(num_blocks=14, block_size=4, num_cpu_blocks=16, mode=PreemptionMode.SWAP)
    group = make_group(6, max_tokens=12, n=3)
    s.add(group)
    out = run_step(s)
    assert out.num_new_tokens == [6, 0, 0] and len(group.seqs) == 3
    assert [seq.sampling_params.seed for seq in group.seqs] == [0, 1, 2]
    assert group.seqs[1].block_table == group.seqs[0].block_table  # before the first write
    out = run_step(s)
    assert len(out.blocks_to_copy) == 2  # two of the three copy the shared partial block
    other = make_group(12, max_tokens=30)
    s.add(other)
    while not s.num_preemptions[PreemptionMode.SWAP]:
        run_step(s)
    assert s.swapped and all(seq.status == SequenceStatus.SWAPPED for seq in s.swapped[0].seqs)
    while s.swapped:
        run_step(s)
    assert s.num_blocks_swapped_in == s.num_blocks_swapped_out > 0
    while s.has_unfinished():
        run_step(s)
    assert all(seq.num_output_tokens == 12 for seq in group.seqs)


def test_request_that_can_never_fit_is_refused():
    s = make_scheduler(num_blocks=4, block_size=4, max_len=100)
    assert "max_model_len" in s.add(make_group(95, max_tokens=10))
    assert "whole pool" in s.add(make_group(10, max_tokens=10))
    assert "whole pool" in s.add(make_group(4, max_tokens=4, n=4))  # 1 + 4 x 1 blocks > 4
    assert "empty" in s.add(make_group(0))
    assert s.add(make_group(8, max_tokens=8)) is None
    assert len(s.waiting) == 1


def test_lone_group_out_of_blocks_is_preempted_for_an_earlier_one():
    s = make_scheduler(num_blocks=2, block_size=2, max_num_seqs=2)
    a, b = make_group(2, max_tokens=2), make_group(2, max_tokens=2)
    s.add(a)
    s.add(b)
    run_step(s)
    out = s.schedule()  # a needs a third block: b is evicted for it
    assert out.seqs == [a.seqs[0]] and out.preempted == [b]
