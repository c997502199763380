"""The GQA-grouped decode kernels of kernels/paged_attention_grouped.cu: one thread block per
(kv head, sequence[, partition]) attends a tile of its group's query heads, reading each K/V
vector once for the whole tile. Planned by paged_attention_launches(..., grouped=True)."""

import functools

import torch

from pagedgen.kernels.decode_tuning import DEFAULT_TUNING, DecodeTuning
from pagedgen.kernels.launch import (
    C_TYPES,
    KernelModule,
    cache_c_type,
    cache_dtypes,
    prefetch_defines,
)

# Instantiated with these in kernels/paged_attention_grouped.cu (threads: DecodeTuning).
GROUP_TILES = (4, 8)
# Partition sizes of the grouped v2 kernel (a runtime argument), largest first: the planner takes
# the largest one that still fills the GPU, so a single long sequence spreads over every SM.
PARTITION_SIZES = (512, 256, 128, 64)
# The kernels' occupancy (their __launch_bounds__): a launch fills an SM with this many blocks.
BLOCKS_PER_SM = 4
# Planning on the CPU (the emulator) assumes an H100 SXM.
DEFAULT_NUM_SMS = 132


def group_tile(group_size: int, head_size: int) -> int:
    """Query heads per thread block. Head size 256 takes 4 (8 spills registers); larger groups
    span several tiles, each reading its kv head's K/V."""
    return 4 if group_size <= 4 or head_size > 128 else 8


def grouped_module(
    dtype: torch.dtype,
    head_size: int,
    block_size: int,
    tile: int,
    cache_dtype: torch.dtype | None = None,  # None: dtype
    l2_prefetch: bool = False,  # kernels/kv_prefetch.cuh
    tuning: DecodeTuning = DEFAULT_TUNING,
) -> KernelModule:
    c_type = C_TYPES[dtype]
    cache_type = cache_c_type(dtype, cache_dtype or dtype)
    args = f"{c_type}, {cache_type}, {head_size}, {block_size}, {tuning.num_threads}, {tile}"
    return KernelModule(
        source="paged_attention_grouped.cu",
        defines=(
            f"PAGEDGEN_SCALAR_T={c_type}",
            f"PAGEDGEN_CACHE_T={cache_type}",
            f"PAGEDGEN_HEAD_SIZE={head_size}",
            f"PAGEDGEN_BLOCK_SIZE={block_size}",
            f"PAGEDGEN_GROUP_TILE={tile}",
            *prefetch_defines(l2_prefetch),
            *tuning.defines,
        ),
        name_expressions=(
            f"pagedgen::paged_attention_grouped_v1_kernel<{args}>",
            f"pagedgen::paged_attention_grouped_v2_kernel<{args}>",
        ),
    )


def grouped_modules(
    head_sizes: tuple[int, ...], block_sizes: tuple[int, ...]
) -> list[KernelModule]:
    """Every module the planner may pick, for those head and block sizes and every cache dtype."""
    tiles = {(h, t) for h in head_sizes for t in GROUP_TILES if t == group_tile(t, h)}
    return [
        grouped_module(dtype, head_size, block_size, tile, cache_dtype)
        for dtype in C_TYPES
        for cache_dtype in cache_dtypes(dtype)
        for head_size, tile in sorted(tiles)
        for block_size in block_sizes
    ]


@functools.cache
def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def grouped_partition_size(
    max_context_len: int, num_work_blocks: int, block_size: int, num_sms: int
) -> int | None:
    """The v2 partition size for num_work_blocks (kv head tile, sequence) pairs, or None for one
    pass (v1): fill_partition_size at the grouped kernels' occupancy."""
    sizes = tuple(size for size in PARTITION_SIZES if size % block_size == 0)
    return fill_partition_size(max_context_len, num_work_blocks, BLOCKS_PER_SM * num_sms, sizes)


def fill_partition_size(
    max_context_len: int, num_work_blocks: int, fill: int, sizes: tuple[int, ...]
) -> int | None:
    """v1 (None) when num_work_blocks alone reach `fill` blocks and contexts are at most 8192
    tokens (vLLM's bound), else the largest of sizes (largest first) whose partitions reach it
    (the smallest one if none does); None too where one partition covers the context."""
    if max_context_len <= 8192 and num_work_blocks >= fill:
        return None
    partition_size = next(
        (size for size in sizes if num_work_blocks * -(-max_context_len // size) >= fill),
        sizes[-1],
    )
    return None if max_context_len <= partition_size else partition_size
