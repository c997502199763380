"""The scheduler through the real engine loop: LLMEngine with a runner that runs no model but
checks, every step, that each sequence's context reads its own K/V (tests/core/kv_shadow.py)."""

import random
import subprocess
import sys
from itertools import count

import pytest
from transformers import AutoConfig

from pagedgen.config import EngineConfig
from pagedgen.core.control_plane import resolve_max_model_len
from pagedgen.core.preemption import PreemptionMode
from pagedgen.core.sequence import SequenceGroup, SequenceStatus
from pagedgen.engine.llm_engine import LLMEngine
from pagedgen.sampling_params import SamplingParams
from tests.core.kv_shadow import ShadowRunner, run_step

_prompt_tokens = count(1000)
_request_ids = count()


def make_engine(
    num_blocks=64,
    block_size=4,
    max_num_seqs=8,
    max_batched=64,
    max_len=256,
    chunked=True,
    mode="auto",
    num_cpu_blocks=0,
    caching=True,
    watermark_blocks=0,
) -> LLMEngine:
    config = EngineConfig(
        model="unused",
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_batched,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=caching,
        preemption_mode=mode,
    )
    runner = ShadowRunner(block_size, num_blocks, num_cpu_blocks)
    engine = LLMEngine(config, runner, None, num_blocks, num_cpu_blocks, max_len, set())
    engine.block_manager.watermark_blocks = watermark_blocks
    return engine


def add(engine: LLMEngine, num_prompt_tokens: int, max_tokens: int = 8, n: int = 1):
    """Adds a request with a prompt of distinct tokens (so prefix caching never links two test
    requests by accident); returns its group, or the error that refused it."""
    request_id = str(next(_request_ids))
    prompt = [next(_prompt_tokens) for _ in range(num_prompt_tokens)]
    params = SamplingParams(max_tokens=max_tokens, n=n, seed=0, detokenize=False)
    engine.add_request(request_id, prompt, params)
    if request_id in engine.requests:
        return engine.requests[request_id].group
    return engine.rejected[-1].group.seqs[0].error


def first_seqs(*groups: SequenceGroup) -> list:
    return [group.seqs[0] for group in groups]


def test_fcfs_admission_and_running_first():
    engine = make_engine()
    groups = [add(engine, 5) for _ in range(3)]
    out = run_step(engine)
    assert out.seqs == first_seqs(*groups) and out.num_new_tokens == [5, 5, 5]
    assert out.sample_seqs == first_seqs(*groups) and out.num_decode_seqs == 0
    late = add(engine, 3)
    out = run_step(engine)
    assert out.seqs == first_seqs(*groups, late)
    assert out.num_new_tokens == [1, 1, 1, 3] and out.num_decode_seqs == 3
    assert out.num_computed_tokens == [5, 5, 5, 0]


def test_max_num_seqs_and_token_budget_without_chunking():
    engine = make_engine(max_num_seqs=2, max_batched=10, chunked=False)
    for _ in range(4):
        add(engine, 4, max_tokens=2)
    assert len(run_step(engine).seqs) == 2  # max_num_seqs
    engine = make_engine(max_num_seqs=8, max_batched=10, chunked=False)
    for _ in range(4):
        add(engine, 4, max_tokens=2)
    assert run_step(engine).num_new_tokens == [4, 4]  # a third would exceed 10 tokens


def test_chunked_prefill_splits_a_long_prompt_and_decodes_go_first():
    engine = make_engine(max_batched=16)
    short = add(engine, 3, max_tokens=20)
    run_step(engine)
    long_ = add(engine, 40)
    chunks = []
    while long_.seqs[0].num_output_tokens == 0:
        out = run_step(engine)
        assert out.seqs[0] is short.seqs[0] and out.num_new_tokens[0] == 1
        assert out.num_batched_tokens <= 16
        chunks.append(out.num_new_tokens[1])
        # a chunk that does not finish the prompt computes but samples nothing
        assert (long_.seqs[0] in out.sample_seqs) == (sum(chunks) == 40)
    assert chunks == [15, 15, 10]


def test_continuous_batching_joins_and_leaves_every_step():
    engine = make_engine(max_num_seqs=2)
    short, long_, waiting = add(engine, 4, 2), add(engine, 4, 6), add(engine, 4)
    assert run_step(engine).seqs == first_seqs(short, long_)
    assert run_step(engine).seqs == first_seqs(short, long_)  # short finishes here
    assert short.is_finished and short.seqs[0].block_table == []
    assert run_step(engine).seqs == first_seqs(long_, waiting)  # joins at once


def test_preempts_most_recent_by_recompute_and_output_survives():
    engine = make_engine(num_blocks=6, block_size=4, max_num_seqs=4, caching=False)
    first, second = add(engine, 8, max_tokens=12), add(engine, 8, max_tokens=12)
    scheduler = engine.scheduler
    while not scheduler.num_preemptions[PreemptionMode.RECOMPUTE]:
        run_step(engine)
    seq = second.seqs[0]
    assert seq.status == SequenceStatus.WAITING and seq.num_computed_tokens == 0
    assert seq.block_table == [] and seq.num_output_tokens > 0
    assert first.seqs[0].status == SequenceStatus.RUNNING
    while not first.is_finished:
        run_step(engine)
    num_tokens = seq.num_tokens
    out = run_step(engine)
    assert out.seqs == [seq]  # recomputed: prompt and the tokens generated so far
    assert out.num_new_tokens == [num_tokens]


def test_parallel_samples_fork_at_the_end_of_the_prompt_and_swap_as_a_group():
    engine = make_engine(num_blocks=14, block_size=4, num_cpu_blocks=16, mode="swap")
    group = add(engine, 6, max_tokens=12, n=3)
    out = run_step(engine)
    assert out.num_new_tokens == [6] and len(group.seqs) == 3
    assert out.sample_seqs == group.seqs and out.sample_rows == [0, 0, 0]
    assert [seq.sampling_params.seed for seq in group.seqs] == [0, 1, 2]
    assert all(seq.num_computed_tokens == 6 for seq in group.seqs)
    assert group.seqs[1].block_table == group.seqs[0].block_table  # before the first write
    out = run_step(engine)
    assert len(out.blocks_to_copy) == 2  # two of the three copy the shared partial block
    add(engine, 12, max_tokens=30)
    scheduler = engine.scheduler
    while not scheduler.num_preemptions[PreemptionMode.SWAP]:
        run_step(engine)
    swapped = scheduler.swapped
    assert swapped and all(seq.status == SequenceStatus.SWAPPED for seq in swapped[0].seqs)
    while scheduler.swapped:
        run_step(engine)
    assert scheduler.num_blocks_swapped_in == scheduler.num_blocks_swapped_out > 0
    while engine.has_unfinished_requests():
        run_step(engine)
    assert all(seq.num_output_tokens == 12 for seq in group.seqs)


def test_request_that_can_never_fit_is_refused():
    engine = make_engine(num_blocks=4, block_size=4, max_len=100, max_num_seqs=4)
    assert "max_model_len" in add(engine, 101, max_tokens=10)
    assert "whole pool" in add(engine, 95, max_tokens=10)  # capped at max_model_len: 25 blocks
    assert "exceeds max_num_seqs (4)" in add(engine, 2, max_tokens=1, n=5)
    assert "whole pool" in add(engine, 10, max_tokens=10)
    assert "whole pool" in add(engine, 4, max_tokens=4, n=4)  # 1 + 4 x 1 blocks > 4
    assert "empty" in add(engine, 0)
    assert isinstance(add(engine, 8, max_tokens=8), SequenceGroup)
    assert len(engine.scheduler.waiting) == 1


def test_lone_group_out_of_blocks_is_preempted_for_an_earlier_one():
    engine = make_engine(num_blocks=2, block_size=2, max_num_seqs=2)
    a, b = add(engine, 2, max_tokens=2), add(engine, 2, max_tokens=2)
    run_step(engine)
    out = run_step(engine)  # a needs a third block: b is evicted for it
    assert out.seqs == [a.seqs[0]] and out.preempted == [b]


def run_to_the_end(engine: LLMEngine, max_steps: int = 1000) -> None:
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return
        run_step(engine)  # raises "can make no progress" on a stall
    raise AssertionError("not done")


def test_a_group_near_the_pool_size_comes_back_from_swap():
    """Swapped out holding 6 of the 10 blocks, a 2-sequence group needs 8 to come back: more
    than the pool less its watermark (3), but all of an idle pool, which it must then get (the
    watermark held it back forever, while waiting groups waited behind it)."""
    engine = make_engine(num_blocks=10, block_size=4, num_cpu_blocks=16, mode="swap")
    engine.block_manager.watermark_blocks = 3
    add(engine, 8, max_tokens=12)
    group = add(engine, 8, max_tokens=16, n=2)
    run_to_the_end(engine)
    assert engine.scheduler.num_preemptions[PreemptionMode.SWAP] == 1
    assert all(seq.num_output_tokens == 16 for seq in group.seqs)


@pytest.mark.parametrize("caching", [False, True])
def test_recomputed_siblings_share_their_prompt_again(caching):
    """After a recompute preemption, 3 samples of 49-55 tokens need 3 x 7 blocks if each
    recomputes its prompt alone, more than the 20-block pool; sharing the prompt's 5 full blocks,
    as when they first ran, they need 11 (the first sequence computes them, the others take them),
    with or without a prefix cache to find them in."""
    engine = make_engine(num_blocks=20, block_size=8, max_batched=256, max_len=512,
                         mode="recompute", caching=caching)  # fmt: skip
    add(engine, 60, max_tokens=40)
    group = add(engine, 41, max_tokens=15, n=3)
    run_to_the_end(engine)
    assert engine.scheduler.num_preemptions[PreemptionMode.RECOMPUTE] >= 1
    assert all(seq.num_output_tokens == 15 for seq in group.seqs)


def test_the_control_plane_imports_without_torch():
    code = (
        "import sys, pkgutil, importlib, pagedgen.core, pagedgen.engine.llm_engine\n"
        "for m in pkgutil.iter_modules(pagedgen.core.__path__):\n"
        "    importlib.import_module('pagedgen.core.' + m.name)\n"
        "heavy = {'torch', 'transformers', 'numpy'} & set(sys.modules)\n"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("seed", range(3))
def test_a_recomputed_group_larger_than_the_token_budget_comes_back(seed):
    """Parallel samples preempted by recompute may hold more uncomputed tokens than one step's
    budget: the first sibling is admitted with what fits, the others wait holding their shared
    prefix, and every request finishes (such a group used to wait forever, all or none)."""
    rng = random.Random(seed)
    engine = make_engine(
        num_blocks=40, block_size=4, max_num_seqs=6, max_batched=24, mode="recompute",
        num_cpu_blocks=48,
    )  # fmt: skip
    prefixes = [[rng.randrange(5) for _ in range(30)] for _ in range(3)]
    num_preempted = 0
    for i in range(600):
        if rng.random() < 0.5:
            prompt = rng.choice(prefixes)[: rng.randint(1, 30)] + [rng.randrange(5)]
            n = rng.choice([1, 1, 2, 3])
            params = SamplingParams(max_tokens=rng.randint(1, 40), n=n, seed=0, detokenize=False)
            engine.add_request(str(i), prompt, params)
        out = run_step(engine)
        num_preempted += out is not None and bool(out.preempted)
        assert out is None or out.num_batched_tokens <= 24
    while engine.has_unfinished_requests():
        run_step(engine)
    assert num_preempted > 5


@pytest.mark.parametrize(
    "model_type, fields, limit",
    [
        ("llama", dict(max_position_embeddings=4096), 4096),
        ("gpt2", dict(n_positions=1024), 1024),  # read through GPT-2's attribute map
        ("mpt", dict(max_seq_len=2048), 2048),
        ("bloom", dict(), 2048),  # ALiBi: no limit named, vLLM's default
        ("cohere", dict(max_position_embeddings=8192, model_max_length=131072), 8192),
    ],
)
def test_max_model_len_reads_the_keys_configs_use(model_type, fields, limit):
    config = AutoConfig.for_model(model_type, **fields)
    assert resolve_max_model_len(config, None) == limit
    assert resolve_max_model_len(config, 100) == 100
    with pytest.raises(ValueError, match="exceeds the model's limit"):
        resolve_max_model_len(config, limit + 1)
