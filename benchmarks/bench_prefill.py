"""Micro-benchmark of prefill attention on a GPU: kernels/prefill_attention.cu (CUDA cores)
against kernels/prefill_attention_mma.cu (tensor cores, cuda_attention_config's
tensor_core_prefill), each batch planned once and timed as `iters` launches captured in one CUDA
graph (the kernels alone), in TFLOP/s of causal attention (2 FLOPs a multiply-add of Q K^T and
of P V, visible keys only).

    python benchmarks/bench_prefill.py [--dtype bfloat16] [--iters 20]
"""

import argparse

import torch
from bench_kernels import graph_time_ms
from rich.console import Console
from rich.table import Table

from pagedgen.kernels import loader
from pagedgen.kernels.prefill_attention import prefill_attention_launch
from tests.kernels.prefill_cases import make_prefill_case

# (label, num_heads, num_kv_heads, head_size, ((query_len, context_len), ...))
SHAPES = [
    ("Llama-3-8B, 8 prompts of 512", 32, 8, 128, ((512, 512),) * 8),
    ("Llama-3-8B, 4 chunks of 512 after 1536 cached", 32, 8, 128, ((512, 2048),) * 4),
    ("Llama-3-8B, 2 prompts of 2048", 32, 8, 128, ((2048, 2048),) * 2),
    ("SmolLM2-135M, 16 prompts of 256", 9, 3, 64, ((256, 256),) * 16),
    ("head 256, 4 prompts of 1024", 8, 4, 256, ((1024, 1024),) * 4),
]


def causal_flops(num_heads: int, head_size: int, seqs: tuple[tuple[int, int], ...]) -> int:
    keys = sum((c - q) * q + q * (q + 1) // 2 for q, c in seqs)  # visible (query, key) pairs
    return 4 * num_heads * head_size * keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    parser.add_argument("--iters", type=int, default=20)
    options = parser.parse_args()
    if not (torch.cuda.is_available() and loader.cupy_available()):
        raise SystemExit("this benchmark needs a CUDA GPU and CuPy (pip install 'pagedgen[cuda]')")
    dtype = getattr(torch, options.dtype)
    console = Console(width=160)
    console.print(f"{torch.cuda.get_device_name()}, {options.dtype}")
    table = Table("shape", "kernel", "GPU ms", "TFLOP/s", "vs CUDA cores")
    for label, num_heads, num_kv_heads, head_size, seqs in SHAPES:
        case = make_prefill_case(dtype, num_heads, num_kv_heads, head_size, 16, seqs, device="cuda")
        out = torch.empty_like(case.query)
        flops = causal_flops(num_heads, head_size, seqs)
        timings = {}
        for name, tensor_cores in (("CUDA cores", False), ("tensor cores", True)):
            plan = prefill_attention_launch(
                out, *case[:6], max(q for q, _ in seqs), case.scale, tensor_cores=tensor_cores
            )
            timings[name] = graph_time_ms(lambda _, plan=plan: loader.launch(plan), options.iters)
        for name, ms in timings.items():
            table.add_row(
                label,
                name,
                f"{ms:.3f}",
                f"{flops / ms / 1e9:.1f}",
                f"{timings['CUDA cores'] / ms:.2f}x",
            )
    console.print(table)


if __name__ == "__main__":
    main()
