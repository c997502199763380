"""The CPU decode attention kernel (kernels/paged_attention_cpu.c) alone: ms per call and GB/s of
K/V read, against a large tensor copy's GB/s, on a decode step of Llama-3.2-1B's shape by default
(64 sequences of 112 tokens, 32/8 heads of 64, bfloat16 cache in blocks of 16, one cache per
layer so that each call reads its K/V from memory as a model's step does):

    python benchmarks/decode_attention_cpu.py [--seqs 64] [--context 112] [--threads 2]
        [--march native] [--baseline OTHER_TREE]

With --baseline, the kernel of that source tree runs too, in turn with this one's, in the same
process, and the ratio is printed.
"""

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch

from pagedgen.kernels import cpu, cpu_build, source


def kernel_of(kernels: Path | None, march: str) -> Callable[..., int]:
    """The decode entry point built from kernels/ of a source tree (None: this one)."""
    if kernels is not None:
        source.kernel_dir = lambda: kernels  # noqa: E731 (the loader asks this module)
    source.kernel_source.cache_clear()
    cpu_build.load_cpu_library.cache_clear()
    cpu._library.cache_clear()
    return cpu._library(march, cpu.KV_DTYPE_CODES[torch.bfloat16]).paged_attention_decode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--context", type=int, default=112)
    parser.add_argument("--heads", type=int, nargs=2, default=(32, 8))
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--march", default="native", help="the build: native, cooperlake, ...")
    parser.add_argument("--baseline", type=Path, help="a source tree whose kernel runs too")
    args = parser.parse_args()

    num_heads, num_kv_heads = args.heads
    bs, d, n = args.block_size, args.head_dim, args.seqs
    width = -(-args.context // bs)
    num_blocks = n * width
    g = torch.Generator().manual_seed(0)
    shape = (num_blocks, bs, num_kv_heads, d)
    caches = [
        (torch.randn(shape, generator=g).bfloat16(), torch.randn(shape, generator=g).bfloat16())
        for _ in range(args.layers)
    ]
    tables = torch.randperm(num_blocks, generator=g).int().view(n, width)
    lens = torch.full((n,), args.context, dtype=torch.int32)
    query = torch.randn(n, num_heads, d, generator=g).bfloat16()
    out = torch.empty_like(query)
    kv_bytes = 2 * int(lens.sum()) * num_kv_heads * d * 2

    calls = []  # the arguments of each layer's call, made once: the kernel alone is timed
    for k, v in caches:
        head = cpu._leading_args(out, query, k, v, tables)
        tail = cpu._trailing_args(query, k, d**-0.5, None, None, None, None, args.threads)
        calls.append((*head, lens.data_ptr(), n, *tail))

    kernels = {"this": kernel_of(None, args.march)}
    if args.baseline is not None:
        kernels["baseline"] = kernel_of(args.baseline / "kernels", args.march)
    outs = {}
    for name, kernel in kernels.items():
        assert kernel(*calls[0]) == 0
        outs[name] = out.clone()
    best = dict.fromkeys(kernels, float("inf"))
    for _ in range(args.repeats):
        for name, kernel in kernels.items():
            start = time.perf_counter()
            for call in calls:
                kernel(*call)
            best[name] = min(best[name], (time.perf_counter() - start) / args.layers)

    src = torch.ones(1 << 28, dtype=torch.uint8)
    dst = torch.empty_like(src)
    copy = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        copy = min(copy, time.perf_counter() - start)
    copy_gbps = 2 * src.numel() / copy / 1e9
    print(
        f"{n} seqs x {args.context} tokens, {num_heads}/{num_kv_heads} heads of {d}, "
        f"{kv_bytes / 1e6:.2f} MB of K/V a call; copy {copy_gbps:.1f} GB/s, "
        f"{args.threads} threads"
    )
    for name, seconds in best.items():
        gbps = kv_bytes / seconds / 1e9
        print(
            f"{name:>9}: {seconds * 1e3:.3f} ms  {gbps:5.1f} GB/s  {gbps / copy_gbps:5.1%} of copy"
        )
    if "baseline" in kernels:
        diff = (outs["this"].float() - outs["baseline"].float()).abs().max().item()
        print(f"baseline / this: {best['baseline'] / best['this']:.2f}x; max |diff| {diff:.3g}")


if __name__ == "__main__":
    main()
