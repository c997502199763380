"""Launches each attention kernel once, for Nsight Compute to profile (benchmarks/gpu_session.sh's
`ncu` stage): decode at three shapes of bench_kernels.py, Llama-3-8B's heads at 256 x 512 tokens
(the batch fills the GPU: one pass), 1 x 4,096 (partitions spread one sequence) and 256 of
ShareGPT's uneven lengths (attention_shapes.sharegpt_lens: the 8B's decode steps), with the
per-head, GQA-grouped and tensor-core kernels; then prefill of 8 prompts of 512 tokens with the
CUDA-core and tensor-core kernels. Each launch runs inside an NVTX range naming it, so the report
says which is which (ncu replays each kernel with caches flushed).

    ncu --nvtx --kernel-name regex:attention --section SpeedOfLight ... \\
        python benchmarks/ncu_attention.py [--dtype bfloat16]
"""

import argparse

import torch
from attention_shapes import SHAREGPT
from bench_kernels import attention_batch

from pagedgen.kernels import loader
from pagedgen.kernels.launch import KernelLaunch
from pagedgen.kernels.paged_attention import paged_attention_launches
from pagedgen.kernels.prefill_attention import prefill_attention_launch
from tests.kernels.prefill_cases import make_prefill_case

DECODE_SHAPES = [
    (256, 512, 32, 8, 128, 16),
    (1, 4096, 32, 8, 128, 16),
    (256, SHAREGPT, 32, 8, 128, 16),
]
DECODE_KERNELS = {
    "per-head": dict(grouped=False, l2_prefetch=None),
    "grouped": dict(grouped=True, l2_prefetch=None),
    "mma": dict(tensor_cores=True),
}


def run(label: str, plan: list[KernelLaunch]) -> None:
    with torch.cuda.nvtx.range(label):
        for kernel_launch in plan:
            loader.launch(kernel_launch)
    torch.cuda.synchronize()
    print(label, [k.name_expression for k in plan])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    options = parser.parse_args()
    dtype = getattr(torch, options.dtype)
    for shape in DECODE_SHAPES:
        batch = attention_batch(shape, dtype)
        for name, kernel_options in DECODE_KERNELS.items():
            plan = paged_attention_launches(*batch.args(0), **kernel_options)
            run("decode {} seqs={} ctx={}".format(name, *shape[:2]), plan)
    case = make_prefill_case(dtype, 32, 8, 128, 16, ((512, 512),) * 8, device="cuda")
    out = torch.empty_like(case.query)
    for name, tensor_cores in (("cuda-cores", False), ("mma", True)):
        plan = prefill_attention_launch(out, *case[:6], 512, case.scale, tensor_cores=tensor_cores)
        run(f"prefill {name} 8 x 512", [plan])


if __name__ == "__main__":
    main()
