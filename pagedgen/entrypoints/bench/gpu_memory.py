"""Room on the GPU for the transformers baselines' copy of the weights, and for generate_batch's
own KV cache.

pagedgen sizes its KV pool to gpu_memory_utilization of the GPU's memory, less what is in use
when it starts; the baselines' model loads afterwards, into what is left. So when they run, the
bench lowers pagedgen's share by the share that copy will take:

    |<- pagedgen: weights, activations, KV pool ->|<- transformers' weights ->|<- rest ->|
    |<-------- utilization - weights share ------>|
    |<---------------------- utilization ------------------------------------>|

generate_batch sizes its paged cache to a share of what is free when it starts, so with it
pagedgen takes half of the utilization, and the two engines' caches come out about equal.
"""

import math
from pathlib import Path

import torch
from safetensors import safe_open

from pagedgen.config import EngineConfig
from pagedgen.entrypoints.bench.engines import TRANSFORMERS_BASELINES
from pagedgen.loader import repacked

GIB = 1 << 30


def checkpoint_num_elements(folder: Path) -> int:
    """How many weight elements the folder's safetensors files hold, from their headers only
    (get_slice reads no tensor data); a folder of quantized weights, as they dequantize."""
    if repacked.is_repacked(folder):
        return repacked.num_elements(folder)
    num_elements = 0
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                num_elements += math.prod(f.get_slice(name).get_shape())
    return num_elements


def kv_gpu_memory_utilization(
    gpu_memory_utilization: float,
    baseline_weights_bytes: int,
    total_bytes: int,
    shares_kv_memory: bool = False,
) -> float:
    """pagedgen's gpu_memory_utilization with the baselines' weights taken out of it; half of it
    where a baseline that sizes its own KV cache from free memory (shares_kv_memory) runs too."""
    if shares_kv_memory:
        gpu_memory_utilization /= 2
    utilization = gpu_memory_utilization - baseline_weights_bytes / total_bytes
    if utilization <= 0:
        raise ValueError(
            f"transformers' copy of the weights ({baseline_weights_bytes / GIB:.1f} GiB) leaves "
            f"no room for pagedgen within gpu_memory_utilization {gpu_memory_utilization} of "
            f"{total_bytes / GIB:.1f} GiB; give --kv-cache-memory or no transformers baselines"
        )
    return utilization


def bench_gpu_memory_utilization(
    model_dir: Path, dtype: torch.dtype, engine: EngineConfig, baselines: list[str]
) -> tuple[float, str | None]:
    """pagedgen's gpu_memory_utilization in a bench against these baselines: the engine's,
    less the share that the transformers baselines' copy of model_dir in dtype will take, and
    halved where generate_batch sizes its own KV cache from what is free. The engine's where no
    transformers baseline runs on this GPU, or the pool is given in GiB (kv_cache_memory). With
    a line saying why, where lowered."""
    default, device, kv_cache_memory = (
        engine.gpu_memory_utilization,
        engine.device,
        engine.kv_cache_memory,
    )
    transformers = set(baselines) & set(TRANSFORMERS_BASELINES)
    on_gpu = device in ("auto", "cuda") or device.startswith("cuda:")
    on_gpu = on_gpu and torch.cuda.is_available()
    if not on_gpu or not transformers or kv_cache_memory is not None:
        return default, None
    shares_kv_memory = "generate_batch" in transformers
    weights_bytes = checkpoint_num_elements(model_dir) * dtype.itemsize
    total_bytes = torch.cuda.mem_get_info(torch.device("cuda" if device == "auto" else device))[1]
    utilization = kv_gpu_memory_utilization(default, weights_bytes, total_bytes, shares_kv_memory)
    shared = ", and generate_batch's KV cache half of the rest" if shares_kv_memory else ""
    return utilization, (
        f"gpu_memory_utilization {default} -> {utilization:.3f}: transformers' "
        f"copy of the weights will take {weights_bytes / GIB:.2f} of {total_bytes / GIB:.1f} GiB"
        f"{shared}"
    )
