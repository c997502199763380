import numpy as np
import torch

from pagedgen.kernels import paged_attention_mma as mma
from pagedgen.kernels.attention_args import (
    check_attention_args,
    check_attention_options,
    per_head_arg,
)
from pagedgen.kernels.decode_plan import (
    PARTITION_SIZE,
    DecodeKernel,
    DecodePlan,
    DecodeShape,
    plan_decode,
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
from pagedgen.kernels.paged_attention_grouped import grouped_module, num_sms

# Instantiated with these in kernels/paged_attention.cu (and PARTITION_SIZE, decode_plan.py).
NUM_THREADS = 128


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
    keep the per-head kernel). l2_prefetch has each warp ask L2 for its next KV block while it
    attends one (kernels/kv_prefetch.cuh), a hint that changes no result. tensor_cores picks
    kernels/paged_attention_mma.cu, tiles of 16 query heads of a kv head on mma.sync with K/V
    streamed through shared memory, for 16-bit caches of the activations' dtype on sm_80 or
    newer, every option included (other layers keep the kernels above). None for any of the
    three applies decode_plan.py's rule; version forces 1 or 2 and partition_size the v2
    partitions."""
    shape = check_decode_args(
        out, query, key_cache, value_cache, block_tables, context_lens, max_context_len,
        window, softcap, sinks, alibi_slopes, seq_order,
    )  # fmt: skip
    if shape.num_seqs == 0:
        return []
    check(max_context_len >= 1, lambda: f"max_context_len must be >= 1, got {max_context_len}")
    dtype, cache_dtype, device = query.dtype, key_cache.dtype, query.device
    shared_mem = mma.shared_bytes(shape.head_size, tuning)
    mma_supported = tensor_cores is not False and mma.supports(
        dtype, cache_dtype, shape.head_size, device, shared_mem
    )
    plan = plan_decode(
        shape,
        num_sms(device),
        mma_supported,
        version,
        partition_size,
        grouped,
        l2_prefetch,
        tensor_cores,
        tuning,
    )
    tensors = (out, query, key_cache, value_cache, block_tables, context_lens)
    options = (window, softcap, sinks, alibi_slopes)
    return decode_launches(plan, *tensors, max_context_len, scale, *options, seq_order, tuning)


def check_decode_args(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    max_context_len: int,
    window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    seq_order: torch.Tensor | None,
) -> DecodeShape:
    """The step's DecodeShape, once every argument of paged_attention_launches passes its
    checks (shapes, dtypes, strides, one device)."""
    num_heads, head_size, block_size, num_kv_heads = check_attention_args(
        query, out, key_cache, value_cache
    )
    num_seqs = query.shape[0]
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
    plain = window is None and softcap is None and sinks is None and alibi_slopes is None
    return DecodeShape(
        num_seqs, num_heads, num_kv_heads, head_size, block_size, max_context_len, plain
    )


def decode_launches(
    plan: DecodePlan,
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    max_context_len: int,
    scale: float,
    window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    seq_order: torch.Tensor | None,
    tuning: DecodeTuning,
) -> list[KernelLaunch]:
    """plan's launches over checked arguments: its kernel's module and arguments, and for v2 the
    partitions' float32 scratch."""
    num_seqs, num_heads, head_size = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    partition_size, grid_x = plan.partition_size, plan.grid_x
    check(
        partition_size % block_size == 0, lambda: f"partition_size {partition_size} % {block_size}"
    )
    dtype, cache_dtype = query.dtype, key_cache.dtype
    per_head, use_mma = plan.kernel is DecodeKernel.PER_HEAD, plan.kernel is DecodeKernel.MMA
    # Grouped or on tensor cores, this module serves the v2 reduce only, which prefetches nothing.
    module = paged_attention_module(
        dtype,
        head_size,
        block_size,
        partition_size,
        cache_dtype,
        plan.l2_prefetch and per_head,
        tuning if per_head else DEFAULT_TUNING,
    )
    # The grouped and mma kernels' partial results have the per-head layout of the v2 reduce's.
    main_module, main_block, shared_mem = module, (tuning.num_threads, 1, 1), 0
    if plan.kernel is DecodeKernel.GROUPED:
        main_module = grouped_module(
            dtype, head_size, block_size, plan.tile, cache_dtype, plan.l2_prefetch, tuning
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
    if plan.version == 1:
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

    check(plan.version == 2, lambda: f"version must be 1, 2 or None, got {plan.version}")
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
