"""Building an engine's model side: the GPU pool's sizing from a measured warm-up step (run here
on the CPU through the real runner, with torch.cuda's memory queries stubbed)."""

import pytest
import torch

from pagedgen import LLM
from pagedgen.config import EngineConfig
from pagedgen.core.kv_geometry import GIB
from pagedgen.engine import model_setup


def test_the_gpu_pool_is_what_weights_and_the_largest_step_leave(tiny_llama_path, monkeypatch):
    llm = LLM(str(tiny_llama_path), kv_cache_memory=0.01, log=lambda m: None)
    runner = llm.engine.runner
    steps = []
    execute = runner.execute

    def recording_execute(scheduled):
        steps.append((scheduled.num_new_tokens, len(scheduled.sample_seqs)))
        allocated[0] += int(0.5 * GIB)  # this step's activations
        return execute(scheduled)

    allocated = [int(1.0 * GIB)]  # weights, with the warm-up pool
    peak = [0]
    monkeypatch.setattr(runner, "execute", recording_execute)
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: peak.clear())
    monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: allocated[0])
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: allocated[0])
    monkeypatch.setattr(cuda, "mem_get_info", lambda device=None: (6 * GIB, 10 * GIB))
    config = EngineConfig(model="unused", max_num_batched_tokens=300, gpu_memory_utilization=0.9)

    kv_cache_bytes = model_setup.gpu_kv_cache_bytes(runner, config, max_model_len=128)

    assert steps == [([128, 128, 44], 3)]  # one step of max_num_batched_tokens prompt tokens
    assert kv_cache_bytes == 0.9 * 10 * GIB - 4 * GIB - 0.5 * GIB
    assert runner.kv_cache.numel() == 0  # the warm-up pool is gone


def test_warm_up_runs_the_largest_step_through_the_real_runner(tiny_llama_path):
    llm = LLM(str(tiny_llama_path), kv_cache_memory=0.01, log=lambda m: None)
    runner = llm.engine.runner
    runner.allocate_kv_cache(3 * 128 // runner.block_size, 0)
    model_setup.warm_up(runner, [128, 128, 128])
    assert runner.kv_cache.abs().sum() > 0  # every layer wrote its K/V


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("preemption_mode", ["swap", "recompute"])
def test_unwritten_cache_memory_never_changes_a_result(tiny_llama_path, backend, preemption_mode):
    """The CPU pool is allocated uninitialised (its pages are touched only as blocks are used):
    with every slot NaN before the run, partly filled blocks, reused blocks, prefix hits, copies
    and swaps included, the greedy tokens are those of a zeroed pool."""
    from pagedgen.attention.cpu_backend import cpu_kernel_error
    from pagedgen.sampling_params import SamplingParams

    if backend == "cpu" and cpu_kernel_error() is not None:
        pytest.skip(cpu_kernel_error())
    prompts = [[7, 8, 9] * 10 + [i] * (i + 1) for i in range(10)]  # a shared prefix
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, n=2)
    outputs = []
    for fill in (0.0, float("nan")):
        llm = LLM(str(tiny_llama_path), kv_cache_memory=40 * 8 * 512 / 2**30, block_size=8,
                  swap_space=0.001, attention_backend=backend, preemption_mode=preemption_mode,
                  log=lambda m: None)  # fmt: skip
        llm.engine.runner.kv_cache.fill_(fill)
        llm.engine.runner.cpu_cache.fill_(fill)
        result = llm.generate(prompts, params)
        outputs.append([c.token_ids for out in result for c in out.outputs])
        assert llm.engine.stats.num_preemptions > 0
    assert outputs[0] == outputs[1]
