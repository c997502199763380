import numpy as np
import torch

from pagedgen.kernels import paged_attention_mma
from pagedgen.kernels.attention_args import (
    check_attention_args,
    check_attention_options,
    per_head_arg,
)
from pagedgen.kernels.launch import (
    C_TYPES,
    KernelLaunch,
    KernelModule,
    cache_c_type,
    check,
    check_tensor,
)

# Instantiated with these in kernels/prefill_attention.cu.
NUM_THREADS = 128
BLOCK_M = 16  # query rows (token, head of the GQA group) per thread block
MAX_GRID_Y = 65535
# kernels/prefill_attention_mma.cu's: rows a thread block, keys a stage by head size, stages.
MMA_BLOCK_M = 64
MMA_STAGES = 2


def mma_tile_keys(head_size: int) -> int:
    return 32 if head_size > 128 else 64


def mma_shared_bytes(head_size: int) -> int:
    """PrefillMmaLayout<head_size>::kSharedBytes: the Q tile, then K and V of every stage."""
    return 2 * head_size * (MMA_BLOCK_M + 2 * MMA_STAGES * mma_tile_keys(head_size))


def prefill_mma_module(dtype: torch.dtype, head_size: int, block_size: int) -> KernelModule:
    c_type = C_TYPES[dtype]
    return KernelModule(
        source="prefill_attention_mma.cu",
        defines=(
            f"PAGEDGEN_SCALAR_T={c_type}",
            f"PAGEDGEN_HEAD_SIZE={head_size}",
            f"PAGEDGEN_BLOCK_SIZE={block_size}",
        ),
        name_expressions=(
            f"pagedgen::prefill_attention_mma_kernel<{c_type}, {head_size}, {block_size}>",
        ),
    )


def prefill_attention_module(
    dtype: torch.dtype,
    head_size: int,
    block_size: int,
    cache_dtype: torch.dtype | None = None,  # None: dtype
) -> KernelModule:
    c_type = C_TYPES[dtype]
    cache_type = cache_c_type(dtype, cache_dtype or dtype)
    return KernelModule(
        source="prefill_attention.cu",
        defines=(
            f"PAGEDGEN_SCALAR_T={c_type}",
            f"PAGEDGEN_CACHE_T={cache_type}",
            f"PAGEDGEN_HEAD_SIZE={head_size}",
            f"PAGEDGEN_BLOCK_SIZE={block_size}",
        ),
        name_expressions=(
            f"pagedgen::prefill_attention_kernel<{c_type}, {cache_type}, {head_size}, "
            f"{block_size}>",
        ),
    )


def prefill_attention_launch(
    out: torch.Tensor,  # [num_tokens, num_heads, head_size]
    query: torch.Tensor,  # [num_tokens, num_heads, head_size], rows may be strided
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    block_tables: torch.Tensor,  # [num_seqs, max_num_blocks_per_seq] int32
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32, rows of query and out per sequence
    context_lens: torch.Tensor,  # [num_seqs] int32, each >= its query length
    max_query_len: int,
    scale: float,
    window: int | None = None,  # a query at position p sees positions p - window < k <= p
    softcap: float | None = None,  # scores become softcap * tanh(scores / softcap)
    sinks: torch.Tensor | None = None,  # [num_heads] float32: a logit in each head's softmax
    # [num_heads] float32: ALiBi, slope * (key position - query position) added to each score
    alibi_slopes: torch.Tensor | None = None,
    tensor_cores: bool | None = False,  # None: where it applies
) -> KernelLaunch | None:
    """Checks the arguments and plans causal attention for every query row of a varlen batch
    in one launch: sequence i's rows cu_seqlens_q[i]:cu_seqlens_q[i + 1] are the last tokens of
    its context_lens[i], whose K/V (these rows' included) are in the cache already: attention
    sees them as the cache holds them, rounded to fp8 in an fp8 cache.

    tensor_cores picks kernels/prefill_attention_mma.cu (mma.sync tiles of 64 rows, K/V streamed
    through shared memory) where it applies: 16-bit caches of the activations' dtype, heads of
    64, 128 or 256, sm_80 or newer; elsewhere kernels/prefill_attention.cu runs. None takes it
    wherever it applies.

    Rows outside every sequence's range are left untouched. None when there is nothing to do."""
    num_heads, head_size, block_size, num_kv_heads = check_attention_args(
        query, out, key_cache, value_cache
    )
    dtype = query.dtype
    check_tensor("block_tables", block_tables, torch.int32, 2)
    check_tensor("cu_seqlens_q", cu_seqlens_q, torch.int32, 1)
    check_tensor("context_lens", context_lens, torch.int32, 1)
    num_seqs = context_lens.shape[0]
    check(
        block_tables.shape[0] == num_seqs and cu_seqlens_q.shape[0] == num_seqs + 1,
        lambda: (
            f"{num_seqs} context lens, {block_tables.shape[0]} block tables, "
            f"{cu_seqlens_q.shape[0]} cu_seqlens_q (want num_seqs + 1)"
        ),
    )
    tensors = (out, query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens)
    tensors += check_attention_options(window, softcap, sinks, num_heads, alibi_slopes)
    devices = {t.device for t in tensors}
    check(len(devices) == 1, lambda: f"all tensors must be on one device, got {devices}")
    if num_seqs == 0 or max_query_len == 0:
        return None
    group = num_heads // num_kv_heads
    use_mma = tensor_cores is not False and paged_attention_mma.supports(
        dtype, key_cache.dtype, head_size, query.device, mma_shared_bytes(head_size)
    )
    num_row_tiles = -(-max_query_len * group // (MMA_BLOCK_M if use_mma else BLOCK_M))
    check(
        num_row_tiles <= MAX_GRID_Y,
        lambda: f"max_query_len {max_query_len} is too long for one launch",
    )

    if use_mma:
        module = prefill_mma_module(dtype, head_size, block_size)
        shared_mem = mma_shared_bytes(head_size)
    else:
        module = prefill_attention_module(dtype, head_size, block_size, key_cache.dtype)
        shared_mem = 0
    return KernelLaunch(
        module,
        module.name_expressions[0],
        (num_kv_heads, num_row_tiles, num_seqs),
        (NUM_THREADS, 1, 1),
        (
            out,
            query,
            key_cache,
            value_cache,
            block_tables,
            cu_seqlens_q,
            context_lens,
            np.int32(block_tables.shape[1]),
            np.int32(query.stride(0)),
            np.int32(group),
            np.float32(scale),
            np.int32(window or 0),
            np.float32(softcap or 0.0),
            per_head_arg(sinks),
            per_head_arg(alibi_slopes),
        ),
        shared_mem,
    )
