from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

# The kernels' scalar template argument for each activation dtype.
C_TYPES = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}
# The cache element types of kernels/common.cuh for fp8 KV caches (vLLM's kv_cache_dtype); a cache
# of any other dtype holds the activation dtype itself.
FP8_C_TYPES = {torch.float8_e4m3fn: "pagedgen::fp8_e4m3", torch.float8_e5m2: "pagedgen::fp8_e5m2"}

# Passed to NVRTC for every module; CuPy adds its include paths, -ftz=true,
# --device-as-default-execution-space and -arch=sm_XX of the device.
NVRTC_OPTIONS = ("-std=c++17",)

KernelArg = torch.Tensor | np.int32 | np.int64 | np.float32


class KernelModule(NamedTuple):
    """One NVRTC compilation: a kernels/ source, the -D macros that pick the instantiations it
    compiles, and the name expressions (template instantiations) it exports."""

    source: str
    defines: tuple[str, ...]
    name_expressions: tuple[str, ...]

    @property
    def options(self) -> tuple[str, ...]:
        return NVRTC_OPTIONS + tuple(f"-D{define}" for define in self.defines)


class KernelLaunch(NamedTuple):
    """kernel<<<grid, block, shared_mem>>>(*args), where the kernel is module's name_expression
    and shared_mem the bytes of its dynamic shared memory (kernels/common.cuh's
    PAGEDGEN_DYNAMIC_SHARED).

    Tensors are passed as device pointers, numpy scalars by value with their own C type.
    """

    module: KernelModule
    name_expression: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[KernelArg, ...]
    shared_mem: int = 0


def check_dtype(dtype: torch.dtype) -> None:
    check(dtype in C_TYPES, lambda: f"dtype must be one of {list(C_TYPES)}, got {dtype}")


def cache_dtypes(dtype: torch.dtype) -> tuple[torch.dtype, ...]:
    """The KV cache dtypes the kernels take beside activations of dtype."""
    return (dtype, *FP8_C_TYPES)


def check_cache_dtype(dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    check(
        cache_dtype in cache_dtypes(dtype),
        lambda: (
            f"a KV cache for {dtype} activations must be {dtype} or one of {list(FP8_C_TYPES)}, "
            f"got {cache_dtype}"
        ),
    )


def cache_c_type(dtype: torch.dtype, cache_dtype: torch.dtype) -> str:
    """The kernels' CACHE_T for a cache of cache_dtype with activations of dtype."""
    check_cache_dtype(dtype, cache_dtype)
    return C_TYPES[dtype] if cache_dtype == dtype else FP8_C_TYPES[cache_dtype]


def cache_module(
    source: str,
    kernel: str,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    last_args: tuple[int, ...] = (),
) -> KernelModule:
    """A module exporting pagedgen::kernel<T, CACHE_T> for activations of dtype and a cache of
    cache_dtype, compiling only that (T, CACHE_T) (the -D macros pick it); with last_args, one
    instantiation kernel<T, CACHE_T, arg> per arg."""
    c_type, cache_type = C_TYPES[dtype], cache_c_type(dtype, cache_dtype)
    args = [f", {arg}" for arg in last_args] or [""]
    return KernelModule(
        source,
        (f"PAGEDGEN_SCALAR_T={c_type}", f"PAGEDGEN_CACHE_T={cache_type}"),
        tuple(f"pagedgen::{kernel}<{c_type}, {cache_type}{arg}>" for arg in args),
    )


def check(ok: bool, message: str | Callable[[], str]) -> None:
    """Raises ValueError(message) unless ok; a message that needs formatting is passed as a
    function, called only then: kernels are planned every layer of every step."""
    if not ok:
        raise ValueError(message if isinstance(message, str) else message())


def check_tensor(
    name: str, t: torch.Tensor, dtype: torch.dtype, ndim: int, contiguous: bool = True
) -> None:
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


def prefetch_defines(l2_prefetch: bool) -> tuple[str, ...]:
    """The decode kernels' -D for kernels/kv_prefetch.cuh: while a warp attends a KV block, it
    asks L2 for the next one it will read."""
    return ("PAGEDGEN_L2_PREFETCH=1",) if l2_prefetch else ()
