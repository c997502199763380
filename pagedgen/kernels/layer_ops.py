"""The decoder layer's elementwise ops on NVIDIA GPUs, each one launch of a kernels/ source:
RMSNorm (with the residual add), SiLU-and-mul, and RoPE with the K/V cache write. Each rounds as
the torch ops it replaces, so outputs stay those of the torch path; on a GPU they cut a layer's
launches from ~40 to ~10."""

import functools

import numpy as np
import torch

from pagedgen.kernels.launch import (
    C_TYPES,
    KernelLaunch,
    KernelModule,
    cache_module,
    check,
    check_dtype,
    check_tensor,
)

VECTOR_BYTES = 16  # what a thread of each kernel here moves at once, where rows allow


def _widths(dtype: torch.dtype) -> tuple[int, int]:
    """The widths each kernel is instantiated for: one element a thread, or VECTOR_BYTES."""
    return 1, VECTOR_BYTES // dtype.itemsize


RMS_NORM = KernelModule(
    "rms_norm.cu",
    (),
    tuple(
        f"pagedgen::rms_norm_kernel<{c_type}, {add}, {width}>"
        for dtype, c_type in C_TYPES.items()
        for add in ("false", "true")
        for width in _widths(dtype)
    ),
)
SILU_AND_MUL = KernelModule(
    "silu_and_mul.cu",
    (),
    tuple(
        f"pagedgen::silu_and_mul_kernel<{c_type}, {width}>"
        for dtype, c_type in C_TYPES.items()
        for width in _widths(dtype)
    ),
)


def rope_and_cache_module(dtype: torch.dtype, cache_dtype: torch.dtype) -> KernelModule:
    """pagedgen::rope_and_cache_kernel<T, CACHE_T, width> at both widths of dtype."""
    return cache_module(
        "rope_and_cache.cu", "rope_and_cache_kernel", dtype, cache_dtype, _widths(dtype)
    )


@functools.cache
def _cupy_available() -> bool:
    from pagedgen.kernels.loader import cupy_available

    return cupy_available()


def usable(t: torch.Tensor) -> bool:
    """These kernels can run on t: a CUDA tensor of a kernel dtype, with CuPy present."""
    return t.is_cuda and t.dtype in C_TYPES and _cupy_available()


def _threads(n: int, limit: int) -> int:
    return min(limit, -(-n // 32) * 32)


def vector_width(lengths: tuple[int, ...], *tensors: torch.Tensor | None) -> int:
    """Elements a thread moves at once: VECTOR_BYTES of the first tensor's dtype, where every
    length (row sizes and strides, in elements) is a multiple of it and every tensor starts
    aligned for a vector of that many of its own elements (rope's float32 cos and sin, an fp8
    cache's bytes), else 1."""
    present = [t for t in tensors if t is not None]
    width = _widths(present[0].dtype)[1]
    aligned = all(t.data_ptr() % (width * t.element_size()) == 0 for t in present)
    return width if aligned and all(n % width == 0 for n in lengths) else 1


def rms_norm_launch(
    out: torch.Tensor,  # [num_tokens, hidden]; may be x
    x: torch.Tensor,  # [num_tokens, hidden], rows may be strided
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # [num_tokens, hidden]: x is added to it first
) -> KernelLaunch | None:
    """Plans out = RMSNorm(x) * weight, or with residual: residual += x, out = RMSNorm(residual)."""
    dtype = x.dtype
    check_dtype(dtype)
    check_tensor("x", x, dtype, 2, contiguous=False)
    check(x.stride(1) == 1, lambda: f"x rows must be contiguous, got strides {x.stride()}")
    check_tensor("out", out, dtype, 2)
    check_tensor("weight", weight, dtype, 1)
    num_tokens, hidden = x.shape
    check(out.shape == x.shape, lambda: f"out {tuple(out.shape)} != x {tuple(x.shape)}")
    check(
        weight.shape[0] == hidden, lambda: f"weight {tuple(weight.shape)} for hidden size {hidden}"
    )
    if residual is not None:
        check_tensor("residual", residual, dtype, 2)
        check(
            residual.shape == x.shape,
            lambda: f"residual {tuple(residual.shape)} != x {tuple(x.shape)}",
        )
    if num_tokens == 0:
        return None
    add = residual is not None
    width = vector_width((hidden, x.stride(0)), out, x, weight, residual)
    return KernelLaunch(
        RMS_NORM,
        f"pagedgen::rms_norm_kernel<{C_TYPES[dtype]}, {'true' if add else 'false'}, {width}>",
        (num_tokens, 1, 1),
        (_threads(hidden // width, 1024), 1, 1),
        (
            out,
            residual if add else out,
            x,
            weight,
            np.float32(eps),
            np.int32(hidden),
            np.int32(x.stride(0)),
        ),
    )


def silu_and_mul_launch(out: torch.Tensor, gate_up: torch.Tensor) -> KernelLaunch | None:
    """Plans out = silu(gate) * up for gate_up rows [gate | up]: [num_tokens, 2 * d] -> [.., d]."""
    dtype = gate_up.dtype
    check_dtype(dtype)
    check_tensor("gate_up", gate_up, dtype, 2)
    check_tensor("out", out, dtype, 2)
    num_tokens, d = out.shape
    check(
        gate_up.shape == (num_tokens, 2 * d),
        lambda: f"gate_up {tuple(gate_up.shape)} for out {tuple(out.shape)}",
    )
    if num_tokens == 0:
        return None
    width = vector_width((d,), out, gate_up)
    return KernelLaunch(
        SILU_AND_MUL,
        f"pagedgen::silu_and_mul_kernel<{C_TYPES[dtype]}, {width}>",
        (num_tokens, 1, 1),
        (_threads(d // width, 1024), 1, 1),
        (out, gate_up, np.int32(d)),
    )


def rope_and_cache_launch(
    query: torch.Tensor,  # [num_tokens, num_heads, head_size], written
    qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_size], rows strided
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor,
    cos: torch.Tensor,  # [num_tokens, head_size // 2] float32: each token's rotary row
    sin: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64; -1 = write nothing
) -> KernelLaunch | None:
    """Plans RoPE on q (into query) and k (in place in qkv), and k and v into their cache slots:
    the roped k rounded to qkv's dtype, then to the cache's where that is fp8."""
    dtype, cache_dtype = qkv.dtype, key_cache.dtype
    check_dtype(dtype)
    module = rope_and_cache_module(dtype, cache_dtype)
    check_tensor("query", query, dtype, 3)
    check_tensor("qkv", qkv, dtype, 2, contiguous=False)
    check(qkv.stride(1) == 1, lambda: f"qkv rows must be contiguous, got strides {qkv.stride()}")
    check_tensor("key_cache", key_cache, cache_dtype, 4)
    check_tensor("value_cache", value_cache, cache_dtype, 4)
    check(
        key_cache.shape == value_cache.shape,
        lambda: f"key_cache {tuple(key_cache.shape)} != value_cache {tuple(value_cache.shape)}",
    )
    num_tokens, num_heads, head_size = query.shape
    num_kv_heads = key_cache.shape[2]
    check(
        key_cache.shape[3] == head_size and head_size % 2 == 0,
        lambda: f"head size {head_size} does not fit the cache's {key_cache.shape[3]}",
    )
    check(
        qkv.shape == (num_tokens, (num_heads + 2 * num_kv_heads) * head_size),
        lambda: (
            f"qkv {tuple(qkv.shape)} for {num_tokens} tokens of {num_heads}+2x{num_kv_heads} heads "
            f"of {head_size}"
        ),
    )
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t, torch.float32, 2)
        if t.shape != (num_tokens, head_size // 2):
            raise ValueError(f"{name} shape {tuple(t.shape)}")
    check_tensor("slot_mapping", slot_mapping, torch.int64, 1)
    check(
        slot_mapping.shape[0] == num_tokens,
        lambda: f"{slot_mapping.shape[0]} slots, {num_tokens} rows",
    )
    if num_tokens == 0:
        return None
    width = vector_width(
        (head_size // 2, qkv.stride(0)), query, qkv, cos, sin, key_cache, value_cache
    )
    return KernelLaunch(
        module,
        module.name_expressions[width > 1],
        (num_tokens, 1, 1),
        (_threads((num_heads + num_kv_heads) * head_size // 2 // width, 512), 1, 1),
        (
            query,
            qkv,
            key_cache,
            value_cache,
            cos,
            sin,
            slot_mapping,
            np.int32(num_heads),
            np.int32(num_kv_heads),
            np.int32(head_size),
            np.int32(qkv.stride(0)),
        ),
    )


def _run(kernel_launch: KernelLaunch | None) -> None:
    from pagedgen.kernels import loader

    if kernel_launch is not None:
        loader.launch(kernel_launch)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _run(rms_norm_launch(out, x, weight, eps))
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """residual += x; x = RMSNorm(residual), in place; returns (x, residual)."""
    _run(rms_norm_launch(x, x, weight, eps, residual))
    return x, residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    out = torch.empty(
        gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype, device=gate_up.device
    )
    _run(silu_and_mul_launch(out, gate_up))
    return out


def rope_and_cache(
    qkv: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(query, key, value) of a fused projection with RoPE applied, K/V written to the cache;
    key and value are views into qkv."""
    num_tokens, head_size = qkv.shape[0], key_cache.shape[3]
    query = torch.empty(num_tokens, num_heads, head_size, dtype=qkv.dtype, device=qkv.device)
    _run(rope_and_cache_launch(query, qkv, key_cache, value_cache, cos, sin, slot_mapping))
    kv = qkv[:, num_heads * head_size :].unflatten(1, (2 * num_kv_heads, head_size))
    return query, kv[:, :num_kv_heads], kv[:, num_kv_heads:]
