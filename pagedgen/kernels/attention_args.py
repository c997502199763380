"""The arguments every attention kernel checks alike (decode, grouped decode, prefill): the
query rows, output and paged caches, and the window, soft cap, sinks and ALiBi options."""

import numpy as np
import torch

from pagedgen.kernels.launch import check, check_cache_dtype, check_dtype, check_tensor

HEAD_SIZES = (64, 80, 96, 128, 256)
BLOCK_SIZES = (8, 16, 32)


def check_attention_args(
    query: torch.Tensor, out: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> tuple[int, int, int, int]:
    """The checks every attention kernel makes of its query rows, output and paged caches (of
    the query's dtype or fp8); returns (num_heads, head_size, block_size, num_kv_heads)."""
    check_tensor("query", query, query.dtype, 3, contiguous=False)
    _, num_heads, head_size = query.shape
    dtype = query.dtype
    check_dtype(dtype)
    check(
        head_size in HEAD_SIZES, lambda: f"head_size must be one of {HEAD_SIZES}, got {head_size}"
    )
    check(
        query.stride(2) == 1 and query.stride(1) == head_size,
        lambda: f"query rows must be contiguous, got strides {query.stride()}",
    )
    check_tensor("out", out, dtype, 3)
    check(
        out.shape == query.shape,
        lambda: f"out shape {tuple(out.shape)} != query {tuple(query.shape)}",
    )
    check_cache_dtype(dtype, key_cache.dtype)
    check_tensor("key_cache", key_cache, key_cache.dtype, 4)
    check_tensor("value_cache", value_cache, key_cache.dtype, 4)
    check(
        key_cache.shape == value_cache.shape,
        lambda: f"key_cache {tuple(key_cache.shape)} != value_cache {tuple(value_cache.shape)}",
    )
    _, block_size, num_kv_heads, cache_head_size = key_cache.shape
    check(
        block_size in BLOCK_SIZES,
        lambda: f"block_size must be one of {BLOCK_SIZES}, got {block_size}",
    )
    check(cache_head_size == head_size, lambda: f"cache head_size {cache_head_size} != {head_size}")
    check(
        num_heads % num_kv_heads == 0,
        lambda: f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}",
    )
    check(
        key_cache.data_ptr() % 16 == 0 and value_cache.data_ptr() % 16 == 0,
        "the caches must be 16-byte aligned (they are read in 16-byte vectors)",
    )
    return num_heads, head_size, block_size, num_kv_heads


def check_attention_options(
    window: int | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
    num_heads: int,
    alibi_slopes: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """The checks every attention kernel makes of a window, a soft cap, sinks and ALiBi slopes;
    returns the per-head tensors given, to find on the launch's device."""
    check(window is None or window >= 1, lambda: f"window must be >= 1, got {window}")
    check(softcap is None or softcap > 0, lambda: f"softcap must be > 0, got {softcap}")
    per_head = {"sinks": sinks, "alibi_slopes": alibi_slopes}
    for name, t in per_head.items():
        if t is not None:
            check_tensor(name, t, torch.float32, 1)
            if t.shape[0] != num_heads:
                raise ValueError(f"{t.shape[0]} {name} for {num_heads} heads")
    return tuple(t for t in per_head.values() if t is not None)


def per_head_arg(t: torch.Tensor | None) -> torch.Tensor | np.uint64:
    """The kernels' argument for sinks or ALiBi slopes: the tensor, or nullptr."""
    return np.uint64(0) if t is None else t
