"""Issue 6 end to end on a tiny random-weight Llama: prefix caching, parallel sampling with
copy-on-write, swap and recompute preemption, and chunked prefill all keep greedy outputs exact."""

import random

import pytest
import torch

from pagedgen import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
BLOCK = 8


def make_llm(path, num_blocks: int | None = None, **kwargs) -> LLM:
    memory = 0.01
    if num_blocks is not None:
        bytes_per_token = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 kv heads, head_dim 16, fp32
        memory = num_blocks * BLOCK * bytes_per_token / 2**30
    return LLM(str(path), block_size=BLOCK, kv_cache_memory=memory, log=lambda m: None, **kwargs)


def prompts_with_shared_prefix(num: int, prefix_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(256) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(256) for _ in range(rng.randint(1, 12))] for _ in range(num)]


def token_ids(outputs) -> list[list[int]]:
    return [c.token_ids for out in outputs for c in out.outputs]


def test_prefix_caching_computes_fewer_prefill_tokens_with_identical_output(tiny_llama_path):
    prompts = prompts_with_shared_prefix(12, prefix_len=64)
    cached = make_llm(tiny_llama_path, max_num_seqs=4)
    plain = make_llm(tiny_llama_path, max_num_seqs=4, enable_prefix_caching=False)
    assert token_ids(cached.generate(prompts, GREEDY)) == token_ids(plain.generate(prompts, GREEDY))
    on, off = cached.engine.stats, plain.engine.stats
    assert off.num_prefix_cache_hits == 0 and on.prefix_cache_hit_rate > 0.6
    assert on.num_prompt_tokens < 0.4 * off.num_prompt_tokens
    cached.engine.block_manager.check_integrity()


def test_shared_prefix_longer_than_the_pool_still_runs(tiny_llama_path):
    prompts = prompts_with_shared_prefix(6, prefix_len=120, seed=1)
    small = make_llm(tiny_llama_path, num_blocks=20)  # 160 slots: one sequence at a time
    big = make_llm(tiny_llama_path, enable_prefix_caching=False)
    assert token_ids(small.generate(prompts, GREEDY)) == token_ids(big.generate(prompts, GREEDY))
    assert small.engine.block_manager.pool.num_evictions > 0


def test_parallel_sampling_shares_blocks_and_matches_separate_seeded_requests(tiny_llama_path):
    prompt = list(range(40, 90))
    params = SamplingParams(n=8, temperature=1.0, seed=7, max_tokens=20)
    together = make_llm(tiny_llama_path)
    (grouped,) = together.generate([prompt], params)
    apart = make_llm(tiny_llama_path, enable_prefix_caching=False)
    separate = apart.generate(
        [prompt] * 8, [SamplingParams(temperature=1.0, seed=7 + i, max_tokens=20) for i in range(8)]
    )
    assert [c.token_ids for c in grouped.outputs] == token_ids(separate)
    assert len({tuple(c.token_ids) for c in grouped.outputs}) > 1
    peak_grouped = together.engine.stats.peak_kv_cache_usage_perc * together.engine.num_blocks
    peak_separate = apart.engine.stats.peak_kv_cache_usage_perc * apart.engine.num_blocks
    assert peak_grouped < 0.5 * peak_separate


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_a_pool_a_tenth_of_the_need_gives_identical_greedy_output(tiny_llama_path, mode):
    rng = random.Random(2)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(5, 40))] for _ in range(16)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    need = sum(-(-(len(p) + 40) // BLOCK) for p in prompts)
    small = make_llm(tiny_llama_path, num_blocks=need // 10, preemption_mode=mode, swap_space=0.01)
    big = make_llm(tiny_llama_path)
    assert token_ids(small.generate(prompts, params)) == token_ids(big.generate(prompts, params))
    stats = small.engine.stats
    assert stats.num_preemptions_by_mode[mode] > 0
    if mode == "swap":
        assert stats.num_blocks_swapped_in == stats.num_blocks_swapped_out > 0
    small.engine.block_manager.check_integrity()


def test_swapped_blocks_come_back_bit_identical(tiny_llama_path):
    llm = make_llm(tiny_llama_path, swap_space=0.01)
    runner = llm.engine.runner
    runner.kv_cache.copy_(torch.randn_like(runner.kv_cache))
    before = runner.kv_cache[:, :, [3, 5, 9]].clone()
    runner.backend.swap_blocks(
        list(runner.kv_cache), list(runner.cpu_cache), [(3, 0), (5, 1), (9, 2)]
    )
    runner.kv_cache.zero_()
    runner.backend.swap_blocks(
        list(runner.cpu_cache), list(runner.kv_cache), [(0, 7), (1, 2), (2, 4)]
    )
    assert torch.equal(runner.kv_cache[:, :, [7, 2, 4]], before)


@pytest.mark.parametrize("chunk", [16, 64])
def test_chunked_prefill_gives_identical_greedy_output(tiny_llama_path, chunk):
    rng = random.Random(3)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (150, 7, 90, 33, 200)]
    chunked = make_llm(tiny_llama_path, max_num_batched_tokens=chunk, max_num_seqs=chunk)
    whole = make_llm(tiny_llama_path, enable_chunked_prefill=False)
    assert token_ids(chunked.generate(prompts, GREEDY)) == token_ids(
        whole.generate(prompts, GREEDY)
    )
    assert chunked.engine.stats.num_steps > whole.engine.stats.num_steps
