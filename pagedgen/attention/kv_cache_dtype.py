"""The KV cache's element type (vLLM's kv_cache_dtype) and how values are rounded into it.

"auto" stores K/V in the model's dtype. The fp8 types halve a 16-bit cache (a quarter of a
float32 one), so the same memory holds twice the tokens: "fp8" and "fp8_e4m3" are OCP E4M3
(finite, max 448), "fp8_e5m2" is E5M2 (max 57344, two mantissa bits). As vLLM without
calibrated scales, values are stored unscaled (scale 1.0), saturated to the type's finite range
and rounded to nearest even; a read widens them exactly. Every backend rounds the same way, so
attention sees the same K/V whichever wrote them, and whether a token's K/V were written this
step or long ago: outputs do not depend on chunking, prefix-cache hits or preemption.
"""

import torch

from pagedgen.config import KV_CACHE_DTYPES

FP8_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    if name == "auto":
        return model_dtype
    if name not in FP8_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {name!r}")
    return FP8_DTYPES[name]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x rounded to the cache dtype: saturated to its finite range first where it is fp8 (a
    plain cast sends E5M2 overflows to inf)."""
    if is_fp8(dtype):
        finite = torch.finfo(dtype).max
        return x.float().clamp(-finite, finite).to(dtype)
    return x.to(dtype)


def round_through_cache(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as a read of the cache would return it, in x's dtype: what attention must see of K/V
    that it takes from this step's activations instead of the cache."""
    if dtype == x.dtype or not is_fp8(dtype):
        return x
    return to_cache_dtype(x, dtype).to(x.dtype)


def writable(cache: torch.Tensor) -> torch.Tensor:
    """A view of the cache that index_copy_ and friends take: torch's CPU kernels have no fp8,
    so fp8 caches are written through their bytes."""
    return cache.view(torch.uint8) if is_fp8(cache.dtype) else cache


def gather(cache: torch.Tensor, index: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """cache.index_select(dim, index), through the bytes of an fp8 cache (not every device's
    index kernels take fp8)."""
    return writable(cache).index_select(dim, index).view(cache.dtype)
