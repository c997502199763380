"""What each CPU optimization buys, measured in one process on the same ShareGPT prompts:

    python benchmarks/cpu_optimizations.py [num_prompts]

Runs pagedgen with the optimizations added one at a time (weight layout for the matmuls, decode
attention path) and prints output tokens/s, decode ms/step and the ratio to the first run, and
checks that every run produced the same greedy tokens.
"""

import os
import sys
import time
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table
from torch import nn

from pagedgen import LLM
from pagedgen.entrypoints.bench.engines import greedy_params
from pagedgen.entrypoints.bench.workloads import sharegpt_workload
from pagedgen.kernels import cpu_features, cpu_gemm
from pagedgen.layers.linear import DENSE, TRANSPOSED, Linear


def nn_linear_layout(llm: LLM) -> None:
    """Back to nn.Linear's [out, in] weights and F.linear, the layout transformers uses."""
    for module in llm.engine.runner.model.modules():
        if isinstance(module, Linear) and module.layout == TRANSPOSED:
            module.weight = nn.Parameter(module.weight.data.t().contiguous(), requires_grad=False)
            module.layout = DENSE  # forward() is then F.linear


# name, matmul kernels allowed (oneDNN, our AVX2 panels), attention backend, change after loading
CONFIGS: list[tuple[str, tuple[bool, bool], str, Callable[[LLM], None] | None]] = [
    ("nn.Linear layout (x @ W.T), SDPA per sequence", (False, False), "torch", nn_linear_layout),
    ("pre-transposed x @ W, SDPA per sequence", (False, False), "torch", None),
    ("pre-transposed x @ W, C decode kernel", (False, False), "cpu", None),
    ("oneDNN packed weights, SDPA per sequence", (True, False), "torch", None),
    ("oneDNN packed weights, C decode kernel", (True, False), "cpu", None),
    ("AVX2 panel matmuls, C decode kernel (default on AVX2)", (True, True), "cpu", None),
]


def run(name: str, kernels: tuple[bool, bool], backend: str, change, num_prompts: int) -> dict:
    onednn, panels = kernels
    os.environ["PAGEDGEN_DISABLE_ONEDNN"] = "0" if onednn else "1"
    os.environ["PAGEDGEN_DISABLE_CPU_GEMM"] = "0" if panels else "1"
    cpu_features.onednn_matmul_dtypes.cache_clear()
    cpu_gemm.enabled.cache_clear()
    llm = LLM(attention_backend=backend, log=lambda _: None)
    if change is not None:
        change(llm)
    workload = sharegpt_workload(llm.tokenizer, num_prompts)
    params = greedy_params(workload)
    llm.generate(workload.prompts[:2], params[:2])  # warm up (and compile the C kernel)
    start = time.perf_counter()
    outputs = llm.generate(workload.prompts, params)
    elapsed = time.perf_counter() - start
    return {
        "name": name,
        "elapsed": elapsed,
        "output_tokens_per_s": workload.num_output_tokens / elapsed,
        "token_ids": [out.outputs[0].token_ids for out in outputs],
    }


def main() -> None:
    num_prompts = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    console = Console(width=150)
    console.print(
        f"ShareGPT {num_prompts} prompts, SmolLM2-135M float32, {cpu_features.isa_name()}, "
        f"{torch.get_num_threads()} threads, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    runs = []
    for config in CONFIGS:
        runs.append(run(*config, num_prompts))
        console.print(f"  {runs[-1]['name']}: {runs[-1]['elapsed']:.1f} s")
    table = Table(title="CPU optimizations, one at a time")
    for column in ("configuration", "elapsed s", "output tokens/s", "vs first", "vs previous"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    table.add_column("same tokens as first")
    for i, r in enumerate(runs):
        table.add_row(
            r["name"],
            f"{r['elapsed']:.1f}",
            f"{r['output_tokens_per_s']:.1f}",
            f"{r['output_tokens_per_s'] / runs[0]['output_tokens_per_s']:.2f}x",
            f"{r['output_tokens_per_s'] / runs[max(i - 1, 0)]['output_tokens_per_s']:.2f}x",
            str(r["token_ids"] == runs[0]["token_ids"]),
        )
    console.print(table)
    console.print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
