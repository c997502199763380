"""Which decode attention kernel serves a layer's step, and how: one pure choice over the step's
shape, the device's properties and the caller's options, apart from checking and packing the
kernels' arguments (paged_attention.py)."""

from enum import Enum
from typing import NamedTuple

from pagedgen.kernels import paged_attention_mma as mma
from pagedgen.kernels.decode_tuning import DEFAULT_TUNING, DecodeTuning
from pagedgen.kernels.paged_attention_grouped import group_tile, grouped_partition_size

# The per-head kernel's v2 partitions, instantiated with it in kernels/paged_attention.cu.
PARTITION_SIZE = 512
# When not told (grouped=None), decode takes the grouped kernel for groups of at least this many
# query heads a kv head, with heads of at least AUTO_GROUPED_MIN_HEAD_SIZE.
AUTO_GROUPED_MIN_GROUP = 4
AUTO_GROUPED_MIN_HEAD_SIZE = 128
# When not told (tensor_cores=None), decode runs on tensor cores wherever the device and dtypes
# allow (mma.supports), for groups of at least this many query heads a kv head (a tile holds 16).
AUTO_MMA_MIN_GROUP = 3


class DecodeKernel(Enum):
    PER_HEAD = "per-head"  # kernels/paged_attention.cu: a thread block per query head
    GROUPED = "grouped"  # paged_attention_grouped.cu: a tile of a kv head's GQA group
    MMA = "mma"  # paged_attention_mma.cu: 16 query heads of a kv head on mma.sync


class DecodeShape(NamedTuple):
    """What the choice reads of a decode step: its batch, the layer's heads and cache."""

    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    max_context_len: int
    # No sliding window, soft cap, sinks or ALiBi: the grouped kernel reads none of them.
    plain: bool

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads


class DecodePlan(NamedTuple):
    kernel: DecodeKernel
    version: int  # 1: one pass; 2: partitions, then their reduce (the mma kernel's own)
    partition_size: int  # v2's tokens a partition
    grid_x: int  # thread blocks a sequence (and partition)
    tile: int  # grouped: query heads a thread block
    l2_prefetch: bool  # each warp asks L2 for its next KV block (kernels/kv_prefetch.cuh)


def use_v1(max_context_len: int, num_seqs: int, num_heads: int, partition_size: int) -> bool:
    """vLLM's rule: one pass when a single partition covers the context or the batch alone fills
    the GPU with (head, sequence) blocks; split the context otherwise."""
    max_num_partitions = -(-max_context_len // partition_size)
    return max_context_len <= 8192 and (max_num_partitions == 1 or num_seqs * num_heads > 512)


def plan_decode(
    shape: DecodeShape,
    num_sms: int,  # the device's multiprocessors
    mma_supported: bool,  # mma.supports the layer's dtypes and heads on the device
    version: int | None = None,  # 1 or 2 forced; None: the kernel's rule
    partition_size: int | None = None,  # v2's forced; None: the kernel's rule
    grouped: bool | None = False,  # None: where AUTO_GROUPED_* hold
    l2_prefetch: bool | None = False,  # None: for the per-head kernel only
    tensor_cores: bool | None = False,  # None: where AUTO_MMA_MIN_GROUP holds, unless grouped
    tuning: DecodeTuning = DEFAULT_TUNING,
) -> DecodePlan:
    """The tensor-core kernel where asked for and supported; else the grouped one where asked
    for and the layer has GQA and no option it lacks; else the per-head kernel. One pass (v1) or
    partitions (v2) by the kernel's rule: use_v1 for the per-head kernel, for the others
    partitions enough to fill the device (grouped_partition_size, mma.mma_partition_size)."""
    group_size = shape.group_size
    if tensor_cores is None:  # a grouped kernel asked for wins
        tensor_cores = not grouped and group_size >= AUTO_MMA_MIN_GROUP
    use_mma = bool(tensor_cores) and mma_supported
    if grouped is None:
        grouped = (
            group_size >= AUTO_GROUPED_MIN_GROUP and shape.head_size >= AUTO_GROUPED_MIN_HEAD_SIZE
        )
    grouped = grouped and group_size > 1 and shape.plain and not use_mma
    if l2_prefetch is None:
        l2_prefetch = not grouped
    tile = group_tile(group_size, shape.head_size)
    max_context_len, num_seqs = shape.max_context_len, shape.num_seqs
    # The kernel's partition size, None for one pass (v1), and its grid.x.
    if use_mma:
        kernel, grid_x = DecodeKernel.MMA, shape.num_kv_heads * mma.num_tiles(group_size)
        planned = mma.mma_partition_size(
            max_context_len, grid_x * num_seqs, shape.head_size, num_sms, tuning
        )
    elif grouped:
        kernel, grid_x = DecodeKernel.GROUPED, shape.num_kv_heads * -(-group_size // tile)
        work_blocks = grid_x * num_seqs
        planned = grouped_partition_size(max_context_len, work_blocks, shape.block_size, num_sms)
    else:
        kernel, grid_x = DecodeKernel.PER_HEAD, shape.num_heads
        size = partition_size or PARTITION_SIZE
        planned = None if use_v1(max_context_len, num_seqs, shape.num_heads, size) else size
    if version is None:
        version = 1 if planned is None else 2
        partition_size = partition_size or planned
    partition_size = partition_size or PARTITION_SIZE
    return DecodePlan(kernel, version, partition_size, grid_x, tile, bool(l2_prefetch))
