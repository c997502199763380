"""Decode steps through DecodeGraphs: buckets, padding and the persistent buffers, proven on the
CPU by "capturing" a graph as an eager rerun over the same buffers (what a replay computes), and
on a GPU, where one is present, by real CUDA graphs against eager runs."""

import random
import weakref

import pytest
import torch

from pagedgen import LLM, SamplingParams
from pagedgen.worker.cuda_graphs import DecodeGraphs, graph_batch_sizes
from pagedgen.worker.graph_capture import capture_decode_graphs


def replay_eagerly(run):
    """A stand-in for CUDA graph capture: replay() reruns the forward over the buffers."""
    output = run()
    return (lambda: output.copy_(run())), output


def test_batch_sizes_are_1_2_4_8_then_every_16_and_end_at_max_num_seqs():
    assert graph_batch_sizes(256) == [1, 2, 4, 8, *range(16, 257, 16)]
    assert graph_batch_sizes(100) == [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 100]
    assert graph_batch_sizes(3) == [1, 2, 3]
    assert graph_batch_sizes(1) == [1]


def workload(seed: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts of many lengths whose outputs end at different steps, so decode batches take
    many sizes, most of them between buckets."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(1, 60))] for _ in range(23)]
    params = [
        SamplingParams(temperature=0, max_tokens=rng.randint(1, 40), ignore_eos=True)
        for _ in prompts
    ]
    return prompts, params


def token_ids(llm: LLM, prompts, params) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(prompts, params)]


def count_replays(llm: LLM) -> dict[int, int]:
    graphs = llm.engine.runner.decode_graphs
    counts = dict.fromkeys(graphs.batch_sizes, 0)
    graphs_ref = weakref.ref(graphs)  # a strong one would make a cycle

    def counted(batch_size: int, num_seqs: int) -> torch.Tensor:
        assert num_seqs <= batch_size and graphs_ref().bucket(num_seqs) == batch_size
        counts[batch_size] += 1
        return DecodeGraphs.replay(graphs_ref(), batch_size, num_seqs)

    graphs.replay = counted
    return counts


@pytest.mark.parametrize("block_size", [4, 16])
def test_replayed_decode_steps_give_the_eager_tokens(tiny_llama_path, block_size):
    kwargs = dict(
        device="cpu", dtype="float32", attention_backend="cpu", block_size=block_size,
        kv_cache_memory=0.01, max_num_seqs=20, max_num_batched_tokens=128, log=lambda m: None,
    )  # fmt: skip
    prompts, params = workload(block_size)
    eager = token_ids(LLM(str(tiny_llama_path), **kwargs), prompts, params)

    llm = LLM(str(tiny_llama_path), **kwargs)
    runner = llm.engine.runner
    num_blocks = llm.engine.block_manager.num_blocks
    capture_decode_graphs(runner, capture=replay_eagerly)
    assert runner.kv_cache.shape[2] == num_blocks + 1  # the padding block, beyond the manager's
    assert runner.decode_graphs.batch_sizes == [1, 2, 4, 8, 16, 20]
    counts = count_replays(llm)
    assert token_ids(llm, prompts, params) == eager
    assert sum(counts.values()) >= 20 and sum(n > 0 for n in counts.values()) >= 4, counts
    llm.engine.block_manager.check_integrity()


def test_padding_rows_touch_no_sequence_block(tiny_llama_path):
    """A replay of 3 rows in the bucket of 4 writes the padding row's K/V to the padding block
    only: every other block of the pool is unchanged but for the 3 slots written."""
    llm = LLM(str(tiny_llama_path), device="cpu", dtype="float32", attention_backend="cpu",
              kv_cache_memory=0.01, max_num_seqs=4, log=lambda m: None)  # fmt: skip
    runner = llm.engine.runner
    capture_decode_graphs(runner, capture=replay_eagerly)
    pool = runner.kv_cache
    pool.fill_(7.0)
    graphs = runner.decode_graphs
    tables = runner.block_tables.table
    tables[:3, 0] = [5, 6, 7]
    slots = torch.tensor([5 * 16 + 3, 6 * 16 + 0, 7 * 16 + 9])
    b = graphs.fill(
        *(torch.tensor(x).numpy() for x in ([1, 2, 3], [3, 0, 9], slots.tolist(), [4, 1, 10])),
        tables,
        torch.tensor([0, 1, 2]).numpy(),
    )
    assert b == 4
    with torch.inference_mode():
        graphs.replay(b, 3)
    flat = pool.flatten(2, 3)  # [layers, 2, slots, kv_heads, head_dim]
    changed = (flat != 7.0).flatten(3).any(-1).any(0).any(0).nonzero().flatten().tolist()
    pad_slot = graphs.pad_block * 16
    assert changed == sorted([*slots.tolist(), pad_slot])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_give_the_eager_tokens_on_a_gpu(head64_llama_path, dtype):
    kwargs = dict(device="cuda", dtype=dtype, kv_cache_memory=0.05, max_num_seqs=20,
                  max_num_batched_tokens=128, log=lambda m: None)  # fmt: skip
    prompts, params = workload(0)
    eager = token_ids(LLM(str(head64_llama_path), **kwargs), prompts, params)
    llm = LLM(str(head64_llama_path), enforce_eager=False, **kwargs)
    assert llm.engine.runner.decode_graphs is not None
    counts = count_replays(llm)
    assert token_ids(llm, prompts, params) == eager
    assert sum(counts.values()) >= 20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_longest_first_decode_graphs_give_the_eager_tokens_on_a_gpu(head64_llama_path, monkeypatch):
    """cuda_attention_config's decode_longest_first sorts the decode rows on the device, inside
    the decode graphs too: their tokens equal the eager engine's, which takes the rows in order.
    Every layer decodes on the tensor-core kernel in one pass (the planner sees a GPU of one SM)."""
    from pagedgen.kernels import paged_attention

    monkeypatch.setattr(paged_attention, "num_sms", lambda device: 1)
    kwargs = dict(device="cuda", dtype="bfloat16", kv_cache_memory=0.05, max_num_seqs=20,
                  max_num_batched_tokens=128, log=lambda m: None)  # fmt: skip
    prompts, params = workload(0)
    mma = {"tensor_core_decode": True}
    eager = token_ids(
        LLM(str(head64_llama_path), cuda_attention_config=mma, **kwargs), prompts, params
    )
    longest_first = {**mma, "decode_longest_first": True}
    llm = LLM(
        str(head64_llama_path), enforce_eager=False, cuda_attention_config=longest_first, **kwargs
    )
    counts = count_replays(llm)
    assert token_ids(llm, prompts, params) == eager
    assert sum(counts.values()) >= 20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("preemption_mode", ["swap", "recompute"])
def test_async_scheduling_on_a_gpu_equals_one_step_at_a_time(head64_llama_path, preemption_mode):
    """The overlap for real: step N + 1 runs on the GPU while the host applies step N. Greedy and
    seeded top-k/top-p rows with logprobs, in a pool small enough to preempt."""
    from tests.worker.test_async_scheduling import outputs, prompts_of

    prompts = prompts_of(4, 24, shared_prefix=16)
    params = [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True) if i % 2 else
        SamplingParams(temperature=0.9, top_k=20 + i, top_p=0.9, seed=i, max_tokens=40,
                       logprobs=2 if i % 3 == 0 else None, min_tokens=3, ignore_eos=i % 4 == 0)
        for i in range(len(prompts))
    ]  # fmt: skip
    kwargs = dict(device="cuda", dtype="float32", kv_cache_memory=0.0004, block_size=16,
                  preemption_mode=preemption_mode, swap_space=0.01, max_num_seqs=16,
                  max_num_batched_tokens=256, enforce_eager=False, log=lambda m: None)  # fmt: skip
    sync = outputs(LLM(str(head64_llama_path), **kwargs), prompts, params)
    llm = LLM(str(head64_llama_path), async_scheduling=True, **kwargs)
    result = outputs(llm, prompts, params)

    def tokens(outs: list[tuple]) -> list:
        return [[c[:4] for c in completions] for completions in outs]

    def logprobs(outs: list[tuple]) -> tuple[list, list[float]]:
        """(the top tokens of each position, every logprob value) over all completions."""
        keys, values = [], []
        for completion in (c for completions in outs for c in completions):
            for position in completion[4] or []:
                keys.append(list(position))
                values += position.values()
            values.append(completion[5] or 0.0)
        return keys, values

    assert tokens(result) == tokens(sync)
    # The two engines preempt at different steps, and a recomputed token's logprob comes from a
    # prefill instead of a decode: equal up to the order of float additions.
    (keys, values), (sync_keys, sync_values) = logprobs(result), logprobs(sync)
    assert keys == sync_keys and len(values) > 100
    assert values == pytest.approx(sync_values, rel=1e-4, abs=1e-5)
    assert llm.engine.stats.num_preemptions_by_mode[preemption_mode] > 0
    llm.engine.block_manager.check_integrity()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_piecewise_cuda_graphs_give_the_eager_outputs_on_a_gpu(
    head64_llama_path, monkeypatch, async_scheduling
):
    """Steps with prefill rows from piecewise CUDA graphs (engine/piecewise_graphs.py), the
    cupy kernels launched between the pieces: prompts join running decodes at many token
    counts, greedy and seeded rows with logprobs, all equal to the eager engine's."""
    from tests.worker.graphs.test_piecewise_graphs import count_piecewise_replays, mixed_params
    from tests.worker.test_async_scheduling import outputs, prompts_of

    prompts = prompts_of(6, 40, shared_prefix=24)
    params = mixed_params(len(prompts))
    kwargs = dict(device="cuda", dtype="bfloat16", kv_cache_memory=0.05, max_num_seqs=12,
                  max_num_batched_tokens=96, async_scheduling=async_scheduling,
                  log=lambda m: None)  # fmt: skip
    eager = outputs(LLM(str(head64_llama_path), enforce_eager=True, **kwargs), prompts, params)
    piecewise = {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    llm = LLM(str(head64_llama_path), compilation_config=piecewise, **kwargs)
    assert llm.engine.runner.piecewise_graphs.token_sizes == [32, 64, 96]
    replays = count_piecewise_replays(monkeypatch)
    result = outputs(llm, prompts, params)
    assert replays[1] >= 10, replays
    # Buckets of 32 rows are the rows eager GEMMs pad to (gemm_rows): the same kernels run.
    assert result == eager
