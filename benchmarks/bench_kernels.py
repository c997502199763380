"""Micro-benchmark of the CUDA kernels: achieved GB/s against the device's peak bandwidth, and the
torch backend's decode attention on the same batch as the baseline.

    python benchmarks/bench_kernels.py [--dtype float16] [--iters 50]
"""

import argparse
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table

from pagedgen.attention.torch_backend import decode_attention
from pagedgen.kernels import loader
from pagedgen.kernels.cache_ops import copy_blocks, reshape_and_cache
from pagedgen.kernels.paged_attention import paged_attention_launches

# (num_seqs, context_len, num_heads, num_kv_heads, head_size, block_size)
ATTENTION_SHAPES = [
    (1, 4096, 32, 8, 128, 16),
    (16, 2048, 32, 8, 128, 16),
    (64, 1024, 32, 8, 128, 16),
    (256, 512, 32, 8, 128, 16),
    (64, 1024, 9, 3, 64, 16),  # SmolLM2-135M
    (32, 8192, 32, 8, 128, 32),
]


def peak_bandwidth() -> float:
    """Bytes/s: memory clock (kHz) x bus width (bits) x 2 (double data rate) / 8."""
    import cupy

    attribute = cupy.cuda.runtime.deviceGetAttribute
    clock_khz = attribute(cupy.cuda.runtime.cudaDevAttrMemoryClockRate, 0)
    bus_bits = attribute(cupy.cuda.runtime.cudaDevAttrGlobalMemoryBusWidth, 0)
    return clock_khz * 1e3 * bus_bits * 2 / 8


def time_ms(fn: Callable[[], None], iters: int) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def attention_row(shape: tuple[int, ...], dtype: torch.dtype, iters: int) -> list[float]:
    num_seqs, context_len, num_heads, num_kv_heads, head_size, block_size = shape
    blocks_per_seq = -(-context_len // block_size)
    num_blocks = num_seqs * blocks_per_seq
    cache_shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.randn(cache_shape, device="cuda", dtype=dtype)
    value_cache = torch.randn_like(key_cache)
    block_tables = torch.randperm(num_blocks, device="cuda", dtype=torch.int32)
    block_tables = block_tables.view(num_seqs, blocks_per_seq)
    context_lens = torch.full((num_seqs,), context_len, dtype=torch.int32, device="cuda")
    query = torch.randn(num_seqs, num_heads, head_size, device="cuda", dtype=dtype)
    out = torch.empty_like(query)
    args = (out, query, key_cache, value_cache, block_tables, context_lens, context_len, 0.1)
    launches = paged_attention_launches(*args)
    version = 1 if len(launches) == 1 else 2

    def ours() -> None:
        for kernel_launch in paged_attention_launches(*args):
            loader.launch(kernel_launch)

    def baseline() -> None:
        decode_attention(
            query, key_cache, value_cache, block_tables, context_lens, context_len, 0.1
        )

    bytes_moved = 2 * (key_cache.numel() + query.numel()) * key_cache.element_size()
    ms, baseline_ms = time_ms(ours, iters), time_ms(baseline, iters)
    return [version, ms, bytes_moved / ms / 1e6, baseline_ms / ms]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--iters", type=int, default=50)
    options = parser.parse_args()
    if not (torch.cuda.is_available() and loader.cupy_available()):
        raise SystemExit("this benchmark needs a CUDA GPU and CuPy (pip install 'pagedgen[cuda]')")
    dtype = getattr(torch, options.dtype)
    peak = peak_bandwidth() / 1e9
    console = Console()
    console.print(f"{torch.cuda.get_device_name()}: peak {peak:.0f} GB/s, {options.dtype}")

    table = Table("kernel", "shape", "ms", "GB/s", "% of peak", "speedup vs torch")
    for shape in ATTENTION_SHAPES:
        version, ms, gbps, speedup = attention_row(shape, dtype, options.iters)
        table.add_row(
            f"paged_attention v{version}",
            "seqs={} ctx={} heads={}/{} head={} block={}".format(*shape),
            f"{ms:.3f}",
            f"{gbps:.0f}",
            f"{100 * gbps / peak:.0f}%",
            f"{speedup:.2f}x",
        )

    num_tokens, num_kv_heads, head_size = 8192, 8, 128
    key_cache = torch.randn(1024, 16, num_kv_heads, head_size, device="cuda", dtype=dtype)
    value_cache = torch.randn_like(key_cache)
    key = torch.randn(num_tokens, num_kv_heads, head_size, device="cuda", dtype=dtype)
    slots = torch.randperm(1024 * 16, device="cuda")[:num_tokens]
    ms = time_ms(lambda: reshape_and_cache(key, key, key_cache, value_cache, slots), options.iters)
    gbps = 4 * key.numel() * key.element_size() / ms / 1e6
    table.add_row(
        "reshape_and_cache",
        f"tokens={num_tokens}",
        f"{ms:.3f}",
        f"{gbps:.0f}",
        f"{100 * gbps / peak:.0f}%",
        "",
    )

    kv_caches = [torch.randn(2, 1024, 16, 8, 128, device="cuda", dtype=dtype) for _ in range(24)]
    pairs = [(i, 512 + i) for i in range(256)]
    ms = time_ms(lambda: copy_blocks(kv_caches, pairs), options.iters)
    gbps = 2 * 2 * len(kv_caches) * len(pairs) * kv_caches[0][0, 0].nbytes / ms / 1e6
    table.add_row(
        "copy_blocks",
        f"layers=24 pairs={len(pairs)}",
        f"{ms:.3f}",
        f"{gbps:.0f}",
        f"{100 * gbps / peak:.0f}%",
        "",
    )
    console.print(table)


if __name__ == "__main__":
    main()
