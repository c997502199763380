import numpy as np
import torch

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
) -> KernelLaunch | None:
    """Checks the arguments and plans causal attention for every query row of a varlen batch
    in one launch: sequence i's rows cu_seqlens_q[i]:cu_seqlens_q[i + 1] are the last tokens of
    its context_lens[i], whose K/V (these rows' included) are in the cache already: attention
    sees them as the cache holds them, rounded to fp8 in an fp8 cache.

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
    num_row_tiles = -(-max_query_len * group // BLOCK_M)
    check(
        num_row_tiles <= MAX_GRID_Y,
        lambda: f"max_query_len {max_query_len} is too long for one launch",
    )

    module = prefill_attention_module(dtype, head_size, block_size, key_cache.dtype)
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
    )


def prefill_attention(
    out: torch.Tensor,  # [num_tokens, num_heads, head_size]
    query: torch.Tensor,  # [num_tokens, num_heads, head_size], rows may be strided
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    block_tables: torch.Tensor,  # [num_seqs, max_num_blocks_per_seq] int32
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    max_query_len: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> None:
    """Prefill attention on the GPU into out; see prefill_attention_launch."""
    from pagedgen.kernels.loader import launch

    kernel_launch = prefill_attention_launch(
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
        cu_seqlens_q,
        context_lens,
        max_query_len,
        scale,
        window,
        softcap,
        sinks,
        alibi_slopes,
    )
    if kernel_launch is not None:
        launch(kernel_launch)
