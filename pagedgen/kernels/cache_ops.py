import numpy as np
import torch

from pagedgen.kernels.launch import (
    C_TYPES,
    FP8_C_TYPES,
    KernelLaunch,
    KernelModule,
    cache_module,
    check,
    check_dtype,
    check_tensor,
)

# Copies move elements of the cache's size: fp8 caches go as bytes.
COPY_C_TYPES = {**C_TYPES, **dict.fromkeys(FP8_C_TYPES, "unsigned char")}
COPY_BLOCKS = KernelModule(
    "copy_blocks.cu",
    (),
    tuple(
        f"pagedgen::copy_blocks_kernel<{c_type}>" for c_type in dict.fromkeys(COPY_C_TYPES.values())
    ),
)


def reshape_and_cache_module(dtype: torch.dtype, cache_dtype: torch.dtype) -> KernelModule:
    return cache_module("reshape_and_cache.cu", "reshape_and_cache_kernel", dtype, cache_dtype)


def reshape_and_cache_launch(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size], rows may be strided
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size], rows may be strided
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; -1 = write nothing
) -> KernelLaunch | None:
    """Plans writing token i's key and value into cache slot slot_mapping[i], rounded as
    to_cache_dtype rounds them where the cache is fp8."""
    dtype, cache_dtype = key.dtype, key_cache.dtype
    check_dtype(dtype)
    module = reshape_and_cache_module(dtype, cache_dtype)
    check_tensor("key_cache", key_cache, cache_dtype, 4)
    check_tensor("value_cache", value_cache, cache_dtype, 4)
    check(
        key_cache.shape == value_cache.shape,
        lambda: f"key_cache {tuple(key_cache.shape)} != value_cache {tuple(value_cache.shape)}",
    )
    num_kv_heads, head_size = key_cache.shape[2:]
    for name, t in (("key", key), ("value", value)):
        check_tensor(name, t, dtype, 3, contiguous=False)
        if t.shape[1:] != (num_kv_heads, head_size):
            raise ValueError(
                f"{name} shape {tuple(t.shape)} does not match the cache's "
                f"{(num_kv_heads, head_size)}"
            )
        if not (t.stride(2) == 1 and t.stride(1) == head_size):
            raise ValueError(f"{name} rows must be contiguous, got strides {t.stride()}")
    check_tensor("slot_mapping", slot_mapping, torch.int64, 1)
    num_tokens = slot_mapping.shape[0]
    check(
        key.shape[0] == num_tokens and value.shape[0] == num_tokens,
        lambda: f"{num_tokens} slots for {key.shape[0]} keys and {value.shape[0]} values",
    )
    if num_tokens == 0:
        return None
    token_size = num_kv_heads * head_size
    return KernelLaunch(
        module,
        module.name_expressions[0],
        (num_tokens, 1, 1),
        (min(512, -(-token_size // 32) * 32), 1, 1),
        (
            key_cache,
            value_cache,
            key,
            value,
            slot_mapping,
            np.int32(key.stride(0)),
            np.int32(value.stride(0)),
            np.int32(token_size),
        ),
    )


def copy_blocks_launch(
    kv_caches: list[torch.Tensor],  # per layer [2 | 1, num_blocks, block_size, kv_heads, head_size]
    src_to_dst: list[tuple[int, int]],
) -> KernelLaunch | None:
    """Plans one launch copying block src to dst, keys and values, in every layer.

    No block may be both a source and a destination: the pairs are copied concurrently.
    """
    if not kv_caches or not src_to_dst:
        return None
    first = kv_caches[0]
    check(
        first.dtype in COPY_C_TYPES,
        lambda: f"kv_caches dtype must be one of {list(COPY_C_TYPES)}, got {first.dtype}",
    )
    for i, kv_cache in enumerate(kv_caches):
        check_tensor(f"kv_caches[{i}]", kv_cache, first.dtype, 5)
        if not (kv_cache.shape == first.shape and kv_cache.device == first.device):
            raise ValueError(
                f"kv_caches[{i}] {tuple(kv_cache.shape)} on {kv_cache.device} differs from "
                f"kv_caches[0] {tuple(first.shape)} on {first.device}"
            )
    num_blocks = first.shape[1]
    sources = {src for src, _ in src_to_dst}
    for src, dst in src_to_dst:
        if not (0 <= src < num_blocks and 0 <= dst < num_blocks):
            raise ValueError(f"block pair {(src, dst)} outside 0..{num_blocks - 1}")
        if dst in sources:
            raise ValueError(f"block {dst} is both a copy source and a destination")
    numel_per_block = first[0, 0].numel()

    def pointers(values: list[int]) -> torch.Tensor:
        host = torch.tensor(values, dtype=torch.int64)
        if first.device.type == "cpu":  # the emulator
            return host
        # From pinned memory, so the copy does not wait for the work queued before it.
        return host.pin_memory().to(first.device, non_blocking=True)

    return KernelLaunch(
        COPY_BLOCKS,
        f"pagedgen::copy_blocks_kernel<{COPY_C_TYPES[first.dtype]}>",
        (len(kv_caches), len(src_to_dst), 1),
        (min(1024, -(-numel_per_block // 32) * 32), 1, 1),
        (
            pointers([kv_cache[0].data_ptr() for kv_cache in kv_caches]),
            pointers([kv_cache[-1].data_ptr() for kv_cache in kv_caches]),  # MLA: K again
            pointers([index for pair in src_to_dst for index in pair]),
            np.int32(numel_per_block),
        ),
    )


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Writes new keys and values into their slots on the GPU; see reshape_and_cache_launch."""
    from pagedgen.kernels.loader import launch

    kernel_launch = reshape_and_cache_launch(key, value, key_cache, value_cache, slot_mapping)
    if kernel_launch is not None:
        launch(kernel_launch)


def copy_blocks(kv_caches: list[torch.Tensor], src_to_dst: list[tuple[int, int]]) -> None:
    """Copies blocks inside every layer's cache on the GPU; see copy_blocks_launch."""
    from pagedgen.kernels.loader import launch

    kernel_launch = copy_blocks_launch(kv_caches, src_to_dst)
    if kernel_launch is not None:
        launch(kernel_launch)


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, src_to_dst: list[tuple[int, int]]) -> None:
    """Copies block src of one cache to block dst of another, host <-> device, as async copies on
    the current stream. The host side must be pinned so the copies really are asynchronous.

    src, dst: [num_blocks, ...] caches of one dtype and block shape; for a layer's
    [2, num_blocks, ...] cache call this for [0] and [1].
    """
    from pagedgen.kernels.loader import copy_async

    check(src.dtype == dst.dtype, lambda: f"src dtype {src.dtype} != dst dtype {dst.dtype}")
    check(
        src.shape[1:] == dst.shape[1:], lambda: f"block shapes differ: {src.shape} vs {dst.shape}"
    )
    check(src.is_contiguous() and dst.is_contiguous(), "src and dst must be contiguous")
    for name, t in (("src", src), ("dst", dst)):
        if not (t.is_cuda or t.is_pinned()):
            raise ValueError(f"{name} must be on the GPU or in pinned host memory")
    block_bytes = src[0].numel() * src.element_size()
    stream = torch.cuda.current_stream(src.device if src.is_cuda else dst.device)
    for src_block, dst_block in src_to_dst:
        if not 0 <= src_block < src.shape[0]:
            raise ValueError(f"src block {src_block} outside 0..{src.shape[0] - 1}")
        if not 0 <= dst_block < dst.shape[0]:
            raise ValueError(f"dst block {dst_block} outside 0..{dst.shape[0] - 1}")
        copy_async(
            dst.data_ptr() + dst_block * block_bytes,
            src.data_ptr() + src_block * block_bytes,
            block_bytes,
            stream.cuda_stream,
        )
