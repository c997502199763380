"""Micro-benchmark of the CUDA kernels: achieved GB/s against the device's peak bandwidth.

Decode attention runs every shape with the per-head kernel and the GQA-grouped one
(cuda_attention_config's grouped_decode), each without and with L2 prefetch of the next KV block
(l2_prefetch), and with the tensor-core one ("mma", tensor_core_decode;
16-bit dtypes only, else its row says which kernel it fell back to), each planned once by
paged_attention_launches (its own v1/v2 choice) and timed two ways: "GPU ms" replays `iters`
repetitions captured in one CUDA graph (the kernels alone, no host overhead), "host ms" plans
and launches from Python every repetition, as an engine step without graphs does. Bytes are
counted once: each kv head's K/V of every context token, the queries and the outputs. Repetitions
cycle through copies of the block tables over disjoint blocks, at least twice the L2 cache in all,
so no repetition finds its K/V in L2. torch's decode attention is the host-launched baseline.

    python benchmarks/bench_kernels.py [--dtype float16] [--iters 50]
"""

import argparse
from collections.abc import Callable
from typing import NamedTuple

import torch
from attention_shapes import ATTENTION_SHAPES, Shape, context_lens, is_uneven, shape_label
from rich.console import Console
from rich.table import Table

from pagedgen.attention.torch_backend import decode_attention
from pagedgen.kernels import loader
from pagedgen.kernels.cache_ops import copy_blocks, reshape_and_cache
from pagedgen.kernels.decode_tuning import DEFAULT_TUNING, DecodeTuning
from pagedgen.kernels.launch import KernelLaunch
from pagedgen.kernels.paged_attention import paged_attention_launches


def time_ms(fn: Callable[[], None], iters: int) -> float:
    """Per call, launched from the host: includes whatever host work starves the GPU."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def graph_time_ms(repetition: Callable[[int], None], iters: int) -> float:
    """Per repetition, on the GPU alone: repetition(0 .. iters - 1) captured into one CUDA graph
    (CuPy launches go to torch's current stream, the capture's), one replay between events."""
    for i in range(iters):  # compiles and loads the kernels outside the capture
        repetition(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(iters):
            repetition(i)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


class AttentionBatch(NamedTuple):
    """A decode batch whose block_tables[i] address the i-th of disjoint copies of its K/V."""

    out: torch.Tensor
    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: list[torch.Tensor]
    context_lens: torch.Tensor
    context_len: int
    bytes_moved: int
    longest_first: torch.Tensor  # the sequences by context length, longest first (seq_order)

    def args(self, copy: int) -> tuple:
        return (
            self.out,
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_tables[copy],
            self.context_lens,
            self.context_len,
            0.1,
        )


def attention_batch(shape: Shape, dtype: torch.dtype) -> AttentionBatch:
    num_seqs, _, num_heads, num_kv_heads, head_size, block_size = shape
    lens = context_lens(shape)
    context_len = max(lens)
    blocks_per_seq = -(-context_len // block_size)
    num_blocks = num_seqs * blocks_per_seq
    block_bytes = 2 * block_size * num_kv_heads * head_size * dtype.itemsize  # K and V
    l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    num_copies = max(1, -(-2 * l2_bytes // (num_blocks * block_bytes)))
    cache_shape = (num_copies * num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.randn(cache_shape, device="cuda", dtype=dtype)
    block_tables = [
        (torch.randperm(num_blocks, device="cuda", dtype=torch.int32) + copy * num_blocks).view(
            num_seqs, blocks_per_seq
        )
        for copy in range(num_copies)
    ]
    query = torch.randn(num_seqs, num_heads, head_size, device="cuda", dtype=dtype)
    kv_bytes = 2 * sum(lens) * num_kv_heads * head_size * dtype.itemsize
    return AttentionBatch(
        out=torch.empty_like(query),
        query=query,
        key_cache=key_cache,
        value_cache=torch.randn_like(key_cache),
        block_tables=block_tables,
        context_lens=torch.tensor(lens, dtype=torch.int32, device="cuda"),
        context_len=context_len,
        bytes_moved=kv_bytes + 2 * query.numel() * query.element_size(),
        longest_first=torch.tensor(
            sorted(range(num_seqs), key=lambda i: -lens[i]), dtype=torch.int32, device="cuda"
        ),
    )


class AttentionTiming(NamedTuple):
    plan: str
    gpu_ms: float
    host_ms: float


def plan_name(launches: list[KernelLaunch]) -> str:
    if "_v2_" not in launches[0].name_expression:
        return "v1"
    return f"v2 x{launches[0].grid[2]} partitions"


def time_attention(
    batch: AttentionBatch,
    grouped: bool,
    l2_prefetch: bool,
    iters: int,
    tuning: DecodeTuning = DEFAULT_TUNING,
    tensor_cores: bool = False,
    version: int | None = None,  # None: the planner's choice; 1 or 2 forces one
    partition_size: int | None = None,  # None: the planner's
    longest_first: bool = False,  # the mma v1 kernel takes the longest sequences first
) -> AttentionTiming:
    options = dict(
        grouped=grouped,
        l2_prefetch=l2_prefetch,
        tensor_cores=tensor_cores,
        version=version,
        partition_size=partition_size,
        tuning=tuning,
        seq_order=batch.longest_first if longest_first else None,
    )
    plans = [
        paged_attention_launches(*batch.args(copy), **options)
        for copy in range(len(batch.block_tables))
    ]

    def repetition(i: int) -> None:
        for kernel_launch in plans[i % len(plans)]:
            loader.launch(kernel_launch)

    def host_launched() -> None:
        for kernel_launch in paged_attention_launches(*batch.args(0), **options):
            loader.launch(kernel_launch)

    gpu_ms = graph_time_ms(repetition, iters)
    plan = plan_name(plans[0])
    if tensor_cores and "_mma_" not in plans[0][0].name_expression:
        kernel = "grouped" if "grouped" in plans[0][0].name_expression else "per-head"
        plan += f" (no mma: {kernel})"
    return AttentionTiming(plan, gpu_ms, time_ms(host_launched, iters))


def add_attention_rows(
    table: Table, shape: Shape, dtype: torch.dtype, iters: int, peak: float
) -> None:
    """The per-head and grouped kernels on one shape, each without and with L2 prefetch, the
    tensor-core kernel, then torch's decode attention."""
    batch = attention_batch(shape, dtype)
    label = shape_label(shape)
    timings = {
        f"{kind}{' +prefetch' if l2_prefetch else ''}": time_attention(
            batch, kind == "grouped", l2_prefetch, iters
        )
        for kind in ("per-head", "grouped")
        for l2_prefetch in (False, True)
    }
    timings["mma"] = time_attention(batch, False, False, iters, tensor_cores=True)
    if is_uneven(shape):  # does taking the longest sequences first balance them?
        timings["mma longest first"] = time_attention(
            batch, False, False, iters, tensor_cores=True, longest_first=True
        )
    per_head = timings["per-head"]
    for name, timing in timings.items():
        gbps = batch.bytes_moved / timing.gpu_ms / 1e6
        table.add_row(
            f"paged_attention {name} {timing.plan}",
            label,
            f"{timing.gpu_ms:.3f}",
            f"{gbps:.0f}",
            f"{100 * gbps / peak:.0f}%",
            f"{timing.host_ms:.3f}",
            f"{per_head.gpu_ms / timing.gpu_ms:.2f}x",
        )
    args = batch.args(0)
    torch_ms = time_ms(lambda: decode_attention(*args[1:]), iters)
    gbps = batch.bytes_moved / torch_ms / 1e6
    table.add_row(
        "torch decode_attention",
        label,
        "",
        f"{gbps:.0f} (host)",
        f"{100 * gbps / peak:.0f}%",
        f"{torch_ms:.3f}",
        f"{per_head.gpu_ms / torch_ms:.2f}x",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float16", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--iters", type=int, default=50)
    options = parser.parse_args()
    if not (torch.cuda.is_available() and loader.cupy_available()):
        raise SystemExit("this benchmark needs a CUDA GPU and CuPy (pip install 'pagedgen[cuda]')")
    dtype = getattr(torch, options.dtype)
    peak = loader.peak_memory_bandwidth(torch.cuda.current_device()) / 1e9
    console = Console(width=220)  # the table whole in a log, not folded to a terminal
    console.print(f"{torch.cuda.get_device_name()}: peak {peak:.0f} GB/s, {options.dtype}")

    table = Table(
        "kernel", "shape", "GPU ms", "GB/s", "% of peak", "host ms", "vs per-head (GPU ms)"
    )
    for shape in ATTENTION_SHAPES:
        add_attention_rows(table, shape, dtype, options.iters, peak)

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
        "",
        f"{gbps:.0f} (host)",
        f"{100 * gbps / peak:.0f}%",
        f"{ms:.3f}",
    )

    kv_caches = [torch.randn(2, 1024, 16, 8, 128, device="cuda", dtype=dtype) for _ in range(24)]
    pairs = [(i, 512 + i) for i in range(256)]
    ms = time_ms(lambda: copy_blocks(kv_caches, pairs), options.iters)
    gbps = 2 * 2 * len(kv_caches) * len(pairs) * kv_caches[0][0, 0].nbytes / ms / 1e6
    table.add_row(
        "copy_blocks",
        f"layers=24 pairs={len(pairs)}",
        "",
        f"{gbps:.0f} (host)",
        f"{100 * gbps / peak:.0f}%",
        f"{ms:.3f}",
    )
    console.print(table)


if __name__ == "__main__":
    main()
