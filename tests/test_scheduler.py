from pagedgen.engine.block_manager import BlockManager
from pagedgen.engine.scheduler import Scheduler
from pagedgen.engine.sequence import Sequence, SequenceStatus
from pagedgen.sampling_params import SamplingParams


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, max_batched=64, max_len=256):
    bm = BlockManager(num_blocks, block_size, watermark=0.0)
    return Scheduler(bm, max_num_seqs, max_batched, max_len)


def make_seq(num_prompt_tokens: int, max_tokens: int = 8) -> Sequence:
    return Sequence("r", [1] * num_prompt_tokens, SamplingParams(max_tokens=max_tokens))


def run_step(scheduler: Scheduler) -> list[Sequence]:
    """Pretends the model ran: every scheduled sequence computes its tokens and samples one."""
    out = scheduler.schedule()
    for seq, num_new in zip(out.seqs, out.num_new_tokens):
        seq.num_computed_tokens += num_new
        seq.append_token_id(7)
        if seq.num_output_tokens >= seq.sampling_params.max_tokens:
            seq.finish(SequenceStatus.FINISHED_LENGTH_CAPPED)
            scheduler.finish(seq)
    scheduler.block_manager.check_integrity()
    return out.seqs


def test_fcfs_admission_and_decodes_first():
    s = make_scheduler()
    seqs = [make_seq(5) for _ in range(3)]
    for seq in seqs:
        assert s.add(seq) is None
    out = s.schedule()
    assert out.seqs == seqs and out.num_new_tokens == [5, 5, 5]
    for seq in seqs:
        seq.num_computed_tokens = 5
        seq.append_token_id(0)
    late = make_seq(3)
    s.add(late)
    out = s.schedule()
    assert out.seqs == seqs + [late]
    assert out.num_new_tokens == [1, 1, 1, 3]


def test_max_num_seqs_and_token_budget():
    s = make_scheduler(max_num_seqs=2, max_batched=10)
    seqs = [make_seq(4, max_tokens=2) for _ in range(4)]
    for seq in seqs:
        s.add(seq)
    assert s.schedule().seqs == seqs[:2]  # max_num_seqs
    s2 = make_scheduler(max_num_seqs=8, max_batched=10)
    seqs = [make_seq(4, max_tokens=2) for _ in range(4)]
    for seq in seqs:
        s2.add(seq)
    assert s2.schedule().num_new_tokens == [4, 4]  # 12 > budget of 10


def test_continuous_batching_joins_and_leaves_every_step():
    s = make_scheduler(max_num_seqs=2)
    short, long_, waiting = make_seq(4, max_tokens=2), make_seq(4, max_tokens=6), make_seq(4)
    for seq in (short, long_, waiting):
        s.add(seq)
    assert run_step(s) == [short, long_]
    assert run_step(s) == [short, long_]  # short finishes here
    assert short.is_finished and short.block_table == []
    assert run_step(s) == [long_, waiting]  # waiting joins as soon as a slot frees


def test_preempts_most_recent_by_recompute_and_output_survives():
    s = make_scheduler(num_blocks=6, block_size=4, max_num_seqs=4)
    first, second = make_seq(8, max_tokens=12), make_seq(8, max_tokens=12)
    s.add(first)
    s.add(second)
    run_step(s)  # 2 + 2 blocks, 2 free
    for _ in range(8):
        run_step(s)
        if s.num_preemptions:
            break
    assert s.num_preemptions == 1
    assert second.status == SequenceStatus.WAITING and second.num_computed_tokens == 0
    assert second.block_table == [] and second.num_output_tokens > 0
    assert first.status == SequenceStatus.RUNNING
    while not first.is_finished:
        run_step(s)
    out = s.schedule()
    assert out.seqs == [second]  # recomputed: prompt and the tokens generated so far
    assert out.num_new_tokens == [second.num_tokens]


def test_request_that_can_never_fit_is_refused():
    s = make_scheduler(num_blocks=4, block_size=4, max_len=100)
    assert "max_model_len" in s.add(make_seq(95, max_tokens=10))
    assert "whole pool" in s.add(make_seq(10, max_tokens=10))
    assert "empty" in s.add(make_seq(0))
    assert s.add(make_seq(8, max_tokens=8)) is None
    assert not s.waiting[0].is_finished and len(s.waiting) == 1


def test_lone_sequence_out_of_blocks_preempts_itself():
    s = make_scheduler(num_blocks=2, block_size=2, max_num_seqs=2)
    a, b = make_seq(2, max_tokens=2), make_seq(2, max_tokens=2)
    s.add(a)
    s.add(b)
    run_step(s)
    out = s.schedule()  # a needs a third block: b is evicted for it
    assert out.seqs == [a] and out.preempted == [b]
