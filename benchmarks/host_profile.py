"""Where the host's time goes in the steps no decode graph replays (prompts joining running
decodes), and what one launch of each kind costs the host:

    python benchmarks/host_profile.py MODEL_DIR WORKLOAD.json [--device cuda] [--top 40]

Runs the workload file's requests (greedy, ignore_eos) through pagedgen with decode graphs,
once to warm up (kernels compiled, GEMM shapes seen) and once with cProfile enabled inside
ModelRunner.forward for the steps that compute prompt tokens only, then prints the functions
by their own time and by cumulative time, per profiled step. Then it times, on the host, a
burst of each launch a layer makes: a torch elementwise op, F.linear at a fixed shape, pagedgen's
RMSNorm (a CuPy RawKernel through kernels.loader) and the loader's own work around a launch.
"""

import argparse
import cProfile
import io
import pstats
import time
from collections.abc import Callable

import torch

from pagedgen import LLM
from pagedgen.entrypoints.bench.engines import greedy_params
from pagedgen.entrypoints.bench.workload_file import read_workload
from pagedgen.entrypoints.bench.workloads import Workload
from pagedgen.worker.model_runner import ModelRunner


def profile_mixed_forwards(llm: LLM, workload: Workload, top: int) -> None:
    prompts, params = workload.prompts, greedy_params(workload)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up pass
    llm.reset_prefix_cache()
    profiler, counted = cProfile.Profile(), [0, 0.0]
    forward = ModelRunner.forward

    def profiled(runner: ModelRunner, scheduled):
        if scheduled.num_decode_seqs == len(scheduled.seqs):
            return forward(runner, scheduled)
        start = time.perf_counter()
        profiler.enable()
        try:
            return forward(runner, scheduled)
        finally:
            profiler.disable()
            counted[0] += 1
            counted[1] += time.perf_counter() - start

    ModelRunner.forward = profiled
    try:
        llm.generate(prompts, params, use_tqdm=False)
    finally:
        ModelRunner.forward = forward
    steps = max(counted[0], 1)
    print(f"{counted[0]} steps with prompt tokens, {1e3 * counted[1] / steps:.2f} ms of forward")
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats(key).print_stats(top)
        print(f"== by {key} (totals over {steps} steps)\n{text.getvalue()}")


def host_us(fn: Callable[[], object], n: int = 2000) -> float:
    """Host microseconds a call, over a burst the device keeps up with (synchronized after)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return 1e6 * host / n


def launch_costs(device: str, dtype: torch.dtype) -> None:
    from pagedgen.kernels import layer_ops, loader

    x = torch.randn(256, 576, device=device, dtype=dtype)
    w = torch.randn(576, 576, device=device, dtype=dtype)
    norm_weight = torch.ones(576, device=device, dtype=dtype)
    out = torch.empty_like(x)
    norm = layer_ops.rms_norm_launch(out, x, norm_weight, 1e-5)
    loader.launch(norm)
    real_call = loader._kernel(norm.module, norm.name_expression, 0, norm.shared_mem)
    costs = {
        "torch x.add_(1)": lambda: x.add_(1),
        "F.linear 256x576x576": lambda: torch.nn.functional.linear(x, w),
        "layer_ops.rms_norm (plan + launch)": lambda: layer_ops.rms_norm(x, norm_weight, 1e-5),
        "loader.launch (planned)": lambda: loader.launch(norm),
        "cupy Function call alone": lambda: real_call(
            norm.grid, norm.block, tuple(map(loader._argument, norm.args)), stream=None
        ),
        "torch.empty 256x576": lambda: torch.empty(256, 576, device=device, dtype=dtype),
    }
    for name, fn in costs.items():
        print(f"{name:40s} {host_us(fn):7.1f} us of host a call")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("workload")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-prompts", type=int, default=400)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--kv-cache-memory", type=float, default=8)
    args = parser.parse_args()
    workload = read_workload(args.workload)
    n = args.num_prompts
    workload = Workload(workload.name, workload.prompts[:n], workload.max_tokens[:n], "token ids")
    llm = LLM(
        args.model,
        device=args.device,
        dtype=args.dtype,
        kv_cache_memory=args.kv_cache_memory,
        enforce_eager=False,
        log=print,
    )
    profile_mixed_forwards(llm, workload, args.top)
    if args.device == "cuda":
        launch_costs(args.device, getattr(torch, args.dtype))


if __name__ == "__main__":
    main()
