"""On a GPU, pagedgen's KV pool leaves room for the transformers baselines' copy of the weights:
the arithmetic and when it applies, with torch.cuda stood in for (no GPU needed)."""

import pytest
import torch
from safetensors import safe_open

from pagedgen.config import EngineConfig
from pagedgen.entrypoints.bench import benchmark
from pagedgen.entrypoints.bench.benchmark import BenchOptions
from pagedgen.entrypoints.bench.gpu_memory import (
    GIB,
    checkpoint_num_elements,
    kv_gpu_memory_utilization,
)
from pagedgen.loader.resolve import ResolvedModel


def test_the_weights_share_comes_out_of_the_utilization():
    assert kv_gpu_memory_utilization(0.9, 16 * GIB, 80 * GIB) == pytest.approx(0.7)
    assert kv_gpu_memory_utilization(0.9, 0, 80 * GIB) == 0.9
    # generate_batch sizes its cache from what is free: pagedgen takes half
    assert kv_gpu_memory_utilization(0.9, 16 * GIB, 80 * GIB, True) == pytest.approx(0.25)
    with pytest.raises(ValueError, match=r"copy of the weights \(80.0 GiB\) leaves no room"):
        kv_gpu_memory_utilization(0.9, 80 * GIB, 80 * GIB)


def test_checkpoint_num_elements_reads_the_headers(tiny_llama_path):
    expected = 0
    for path in tiny_llama_path.glob("*.safetensors"):
        with safe_open(path, framework="pt") as f:
            expected += sum(f.get_tensor(name).numel() for name in f.keys())  # noqa: SIM118
    assert checkpoint_num_elements(tiny_llama_path) == expected > 0


@pytest.fixture
def fake_gpu(monkeypatch):
    total = 1 << 20  # the tiny model's float32 weights are a tenth of it, or so
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total // 2, total))
    return total


@pytest.mark.parametrize(
    ("device", "baselines", "kv_cache_memory", "lowered", "halved"),
    [
        ("cuda", ["static32"], None, True, False),
        ("cuda:0", ["generate_batch", "vllm"], None, True, True),
        ("cuda", ["static32"], 1.0, False, False),  # a pool given in GiB is kept
        ("cuda", ["vllm"], None, False, False),  # its own process: nothing loads beside pagedgen
        ("cuda", [], None, False, False),
        ("cpu", ["static32"], None, False, False),
    ],
)
def test_only_a_gpu_bench_with_transformers_baselines_lowers_it(
    tiny_llama_path, fake_gpu, device, baselines, kv_cache_memory, lowered, halved
):
    engine = EngineConfig(
        str(tiny_llama_path), dtype="float32", device=device, kv_cache_memory=kv_cache_memory
    )
    options = BenchOptions(engine, baselines=baselines)
    logged: list[str] = []
    got = benchmark._gpu_memory_utilization(options, ResolvedModel(tiny_llama_path), logged.append)
    weights = checkpoint_num_elements(tiny_llama_path) * 4  # float32
    expected = (0.45 if halved else 0.9) - weights / fake_gpu if lowered else 0.9
    assert got == pytest.approx(expected)
    assert bool(logged) == lowered
