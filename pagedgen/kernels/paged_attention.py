import numpy as np
import torch

from pagedgen.kernels import paged_attention_mma as mma
from pagedgen.kernels.attention_args import (
    check_attention_args,
    check_attention_options,
    per_head_arg,
)
from pagedgen.kernels.decode_tuning import DEFAULT_TUNING, DecodeTuning
from pagedgen.kernels.launch import (
    C_TYPES,
    KernelLaunch,
    KernelModule,
    cache_c_type,
    check,
    check_tensor,
    prefetch_defines,
)
from pagedgen.kernels.paged_attention_grouped import (
    group_tile,
    grouped_module,
    grouped_partition_size,
    num_sms,
)

# Instantiated with these in kernels/paged_attention.cu.
NUM_THREADS = 128
PARTITION_SIZE = 512
# When not told (grouped=None), decode takes the grouped kernel for groups of at least this many
# query heads a kv head, with heads of at least AUTO_GROUPED_MIN_HEAD_SIZE: on an H100
# (benchmarks/bench_kernels.py, bfloat16) it ran 1.4-2.0x the per-head kernel at 4:1 with heads
# of 128, from 1 x 4,096 to 256 x 512 tokens, and 0.63x at SmolLM2's 3:1 with heads of 64.
AUTO_GROUPED_MIN_GROUP = 4
AUTO_GROUPED_MIN_HEAD_SIZE = 128
# When not told (tensor_cores=None), decode runs on tensor cores wherever mma.supports the layer,
# for groups of at least AUTO_MMA_MIN_GROUP query heads a kv head (a tile holds 16): on an H200
# (bench_kernels.py, bfloat16) the mma kernel ran 1.7-4.4x the per-head kernel on all six shapes
# at 3:1 and 4:1, 1.8-2.8x the grouped one on five, 0.83x it for one 4,096-token sequence.
AUTO_MMA_MIN_GROUP = 3


def use_v1(max_context_len: int, num_seqs: int, num_heads: int, partition_size: int) -> bool:
    """vLLM's rule: one pass when a single partition covers the context or the batch alone fills
    the GPU with (head, sequence) blocks; split the context otherwise."""
    max_num_partitions = -(-max_context_len // partition_size)
    return max_context_len <= 8192 and (max_num_partitions == 1 or num_seqs * num_heads > 512)


def paged_attention_module(
    dtype: torch.dtype,
    head_size: int,
    block_size: int,
    partition_size: int = PARTITION_SIZE,
    cache_dtype: torch.dtype | None = None,  # None: dtype
    l2_prefetch: bool = False,  # kernels/kv_prefetch.cuh
    tuning: DecodeTuning = DEFAULT_TUNING,
) -> KernelModule:
    c_type = C_TYPES[dtype]
    cache_type = cache_c_type(dtype, cache_dtype or dtype)
    threads = tuning.num_threads
    return KernelModule(
        source="paged_attention.cu",
        defines=(
            f"PAGEDGEN_SCALAR_T={c_type}",
            f"PAGEDGEN_CACHE_T={cache_type}",
            f"PAGEDGEN_HEAD_SIZE={head_size}",
            f"PAGEDGEN_BLOCK_SIZE={block_size}",
            *prefetch_defines(l2_prefetch),
            *tuning.defines,
        ),
        name_expressions=(
            f"pagedgen::paged_attention_v1_kernel<{c_type}, {cache_type}, {head_size}, "
            f"{block_size}, {threads}>",
            f"pagedgen::paged_attention_v2_kernel<{c_type}, {cache_type}, {head_size}, "
            f"{block_size}, {threads}, {partition_size}>",
            f"pagedgen::paged_attention_v2_reduce_kernel<{c_type}, {head_size}, {NUM_THREADS}, "
            f"{partition_size}>",
        ),
    )


def paged_attention_launches(
    out: torch.Tensor,  # [num_seqs, num_heads, head_size]
    query: torch.Tensor,  # [num_seqs, num_heads, head_size], rows may be strided
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    block_tables: torch.Tensor,  # [num_seqs, max_num_blocks_per_seq] int32
    context_lens: torch.Tensor,  # [num_seqs] int32, each >= 1
    max_context_len: int,
    scale: float,
    version: int | None = None,
    partition_size: int | None = None,
    grouped: bool | None = False,
    l2_prefetch: bool | None = False,
    tensor_cores: bool | None = False,
    window: int | None = None,  # a query sees its last `window` tokens; earlier blocks unread
    softcap: float | None = None,  # scores become softcap * tanh(scores / softcap)
    sinks: torch.Tensor | None = None,  # [num_heads] float32: a logit in each head's softmax
    # [num_heads] float32: ALiBi, slope * (key position - query position) added to each score
    alibi_slopes: torch.Tensor | None = None,
    tuning: DecodeTuning = DEFAULT_TUNING,  # the main kernel's compile-time knobs
    # [num_seqs] int32, a permutation: the order the tensor-core v1 kernel takes the sequences in
    # (longest first balances an uneven batch); the other kernels take them in order
    seq_order: torch.Tensor | None = None,
) -> list[KernelLaunch]:
    """Checks the arguments and plans decode attention for one query row per sequence: a single
    v1 launch, or v2 and its reduce (then also allocating their float32 scratch tensors; the
    tensor-core v2 combines its partitions itself, with completion counters of its own). The
    caches hold the query's dtype or an fp8 one (float8_e4m3fn, float8_e5m2), read exactly.

    grouped picks kernels/paged_attention_grouped.cu, one thread block per kv head for a tile of
    its GQA group (layers without GQA, or with a window, soft cap, sinks or ALiBi, which it lacks,
    keep the per-head kernel); None picks it where it was measured faster (AUTO_GROUPED_*).
    l2_prefetch has each warp ask L2 for its next KV block while it attends one
    (kernels/kv_prefetch.cuh), a hint that changes no result; None prefetches where it was
    measured faster: the per-head kernel (on an H100, bfloat16, prefetch ran it 1.02-1.25x as
    fast on all six shapes of bench_kernels.py, the grouped one 0.88-1.03x).
    tensor_cores picks kernels/paged_attention_mma.cu, tiles of 16 query heads of a kv head on
    mma.sync with K/V streamed through shared memory, for 16-bit caches of the activations'
    dtype on sm_80 or newer, every option included (other layers keep the kernels above); None
    picks it for groups of AUTO_MMA_MIN_GROUP or more, where it was measured faster, unless
    grouped is True.
    version forces 1 or 2 and partition_size the v2 partitions; None applies use_v1 and
    PARTITION_SIZE, or for grouped kernels grouped_partition_size."""
    num_heads, head_size, block_size, num_kv_heads = check_attention_args(
        query, out, key_cache, value_cache
    )
    num_seqs, dtype = query.shape[0], query.dtype
    check_tensor("block_tables", block_tables, torch.int32, 2)
    check_tensor("context_lens", context_lens, torch.int32, 1)
    check(
        block_tables.shape[0] == num_seqs and context_lens.shape[0] == num_seqs,
        lambda: (
            f"{num_seqs} queries, {block_tables.shape[0]} block tables, "
            f"{context_lens.shape[0]} context lens"
        ),
    )
    check(
        max_context_len <= block_tables.shape[1] * block_size,
        lambda: (
            f"max_context_len {max_context_len} exceeds the block tables' "
            f"{block_tables.shape[1]} blocks of {block_size}"
        ),
    )
    tensors = (out, query, key_cache, value_cache, block_tables, context_lens)
    tensors += check_attention_options(window, softcap, sinks, num_heads, alibi_slopes)
    if seq_order is not None:
        check_tensor("seq_order", seq_order, torch.int32, 1)
        check(
            seq_order.shape[0] == num_seqs,
            lambda: f"{num_seqs} queries, seq_order {seq_order.shape}",
        )
        tensors += (seq_order,)
    devices = {t.device for t in tensors}
    check(len(devices) == 1, lambda: f"all tensors must be on one device, got {devices}")
    if num_seqs == 0:
        return []
    check(max_context_len >= 1, lambda: f"max_context_len must be >= 1, got {max_context_len}")

    group_size = num_heads // num_kv_heads
    plain = window is None and softcap is None and sinks is None and alibi_slopes is None
    cache_dtype = key_cache.dtype
    if tensor_cores is None:  # a grouped kernel asked for wins
        tensor_cores = not grouped and group_size >= AUTO_MMA_MIN_GROUP
    use_mma = tensor_cores and mma.supports(
        dtype, cache_dtype, head_size, query.device, mma.shared_bytes(head_size, tuning)
    )
    if grouped is None:
        grouped = group_size >= AUTO_GROUPED_MIN_GROUP and head_size >= AUTO_GROUPED_MIN_HEAD_SIZE
    grouped = grouped and group_size > 1 and plain and not use_mma
    if l2_prefetch is None:
        l2_prefetch = not grouped
    tile = group_tile(group_size, head_size)
    # The planner's partition size, None for one pass (v1), and the kernel's grid.x.
    if use_mma:
        grid_x = num_kv_heads * mma.num_tiles(group_size)
        work_blocks, size = grid_x * num_seqs, head_size
        sms = num_sms(query.device)
        planned = mma.mma_partition_size(max_context_len, work_blocks, size, sms, tuning)
    elif grouped:
        grid_x = num_kv_heads * -(-group_size // tile)
        work_blocks, size = grid_x * num_seqs, block_size
        planned = grouped_partition_size(max_context_len, work_blocks, size, num_sms(query.device))
    else:
        grid_x, size = num_heads, partition_size or PARTITION_SIZE
        planned = None if use_v1(max_context_len, num_seqs, num_heads, size) else size
    if version is None:
        version = 1 if planned is None else 2
        partition_size = partition_size or planned
    partition_size = partition_size or PARTITION_SIZE
    check(
        partition_size % block_size == 0, lambda: f"partition_size {partition_size} % {block_size}"
    )
    # Grouped or on tensor cores, this module serves the v2 reduce only, which prefetches nothing.
    per_head = not (grouped or use_mma)
    module = paged_attention_module(
        dtype,
        head_size,
        block_size,
        partition_size,
        cache_dtype,
        l2_prefetch and per_head,
        tuning if per_head else DEFAULT_TUNING,
    )
    # The grouped and mma kernels' partial results have the per-head layout of the v2 reduce's.
    main_module, main_block, shared_mem = module, (tuning.num_threads, 1, 1), 0
    if grouped:
        main_module = grouped_module(
            dtype, head_size, block_size, tile, cache_dtype, l2_prefetch, tuning
        )
    elif use_mma:
        main_module = mma.mma_module(dtype, head_size, block_size, tuning)
        main_block, shared_mem = (mma.NUM_THREADS, 1, 1), mma.shared_bytes(head_size, tuning)
    v1_name, v2_name = main_module.name_expressions[:2]
    block = (NUM_THREADS, 1, 1)  # the v2 reduce's
    common = (
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        np.int32(block_tables.shape[1]),
        np.int32(query.stride(0)),
        np.int32(num_kv_heads),
        np.float32(scale),
    )
    options = (np.int32(window or 0), np.float32(softcap or 0.0))
    if version == 1:
        if per_head:
            tail = (*options, per_head_arg(sinks), per_head_arg(alibi_slopes))
        else:
            tail = (np.int32(num_heads),)
        if use_mma:
            tail += (*options, per_head_arg(sinks), per_head_arg(alibi_slopes))
            tail += (per_head_arg(seq_order),)
        args = (out, *common, *tail)
        grid = (grid_x, num_seqs, 1)
        return [KernelLaunch(main_module, v1_name, grid, main_block, args, shared_mem)]

    check(version == 2, lambda: f"version must be 1, 2 or None, got {version}")
    max_num_partitions = -(-max_context_len // partition_size)
    stats_shape = (num_seqs, num_heads, max_num_partitions)
    exp_sums = torch.empty(stats_shape, dtype=torch.float32, device=query.device)
    max_logits = torch.empty_like(exp_sums)
    tmp_out = torch.empty((*stats_shape, head_size), dtype=torch.float32, device=query.device)
    if per_head:
        tail = (*options, per_head_arg(alibi_slopes))  # sinks join in the reduce
    else:
        tail = (np.int32(num_heads), np.int32(partition_size))
    if use_mma:  # combines its partitions itself, sinks included
        tail += (*options, per_head_arg(sinks), per_head_arg(alibi_slopes))
        scratch = (exp_sums, max_logits, tmp_out, mma.counters(query.device, grid_x * num_seqs))
        args = (out, *scratch, *common, *tail)
        grid = (grid_x, num_seqs, max_num_partitions)
        return [KernelLaunch(main_module, v2_name, grid, main_block, args, shared_mem)]
    return [
        KernelLaunch(
            main_module,
            v2_name,
            (grid_x, num_seqs, max_num_partitions),
            main_block,
            (exp_sums, max_logits, tmp_out, *common, *tail),
            shared_mem,
        ),
        KernelLaunch(
            module,
            module.name_expressions[2],
            (num_heads, num_seqs, 1),
            block,
            (
                out,
                exp_sums,
                max_logits,
                tmp_out,
                context_lens,
                np.int32(max_num_partitions),
                options[0],
                per_head_arg(sinks),
            ),
        ),
    ]
