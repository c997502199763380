"""Launches each decode attention kernel once on two shapes of bench_kernels.py, for Nsight
Compute to profile (benchmarks/gpu_session.sh's `ncu` stage): Llama-3-8B's heads at 256 x 512
tokens (the batch fills the GPU: one pass) and 1 x 4,096 (partitions spread one sequence), with
the per-head, GQA-grouped and tensor-core kernels, each launch inside an NVTX range naming it,
so that the report says which is which (ncu replays each kernel with caches flushed).

    ncu --nvtx --kernel-name regex:paged_attention --section SpeedOfLight ... \
        python benchmarks/ncu_decode.py [--dtype bfloat16]
"""

import argparse

import torch
from bench_kernels import attention_batch

from pagedgen.kernels import loader
from pagedgen.kernels.paged_attention import paged_attention_launches

SHAPES = [(256, 512, 32, 8, 128, 16), (1, 4096, 32, 8, 128, 16)]
KERNELS = {
    "per-head": dict(grouped=False, l2_prefetch=None),
    "grouped": dict(grouped=True, l2_prefetch=None),
    "mma": dict(tensor_cores=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    options = parser.parse_args()
    dtype = getattr(torch, options.dtype)
    for shape in SHAPES:
        batch = attention_batch(shape, dtype)
        for name, kernel_options in KERNELS.items():
            plan = paged_attention_launches(*batch.args(0), **kernel_options)
            label = "{} seqs={} ctx={}".format(name, *shape[:2])
            with torch.cuda.nvtx.range(label):
                for kernel_launch in plan:
                    loader.launch(kernel_launch)
            torch.cuda.synchronize()
            print(label, [k.name_expression for k in plan])


if __name__ == "__main__":
    main()
