from typing import NamedTuple

import numpy as np
import torch

# The kernels' scalar template argument for each cache dtype.
C_TYPES = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}

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
    """kernel<<<grid, block>>>(*args), where the kernel is module's name_expression.

    Tensors are passed as device pointers, numpy scalars by value with their own C type.
    """

    module: KernelModule
    name_expression: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[KernelArg, ...]


def typed_module(source: str, kernel: str) -> KernelModule:
    """A module exporting pagedgen::kernel<T> for every kernel dtype T, with no -D macros."""
    return KernelModule(
        source, (), tuple(f"pagedgen::{kernel}<{c_type}>" for c_type in C_TYPES.values())
    )


def check_dtype(dtype: torch.dtype) -> None:
    check(dtype in C_TYPES, f"dtype must be one of {list(C_TYPES)}, got {dtype}")


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def check_tensor(
    name: str, t: torch.Tensor, dtype: torch.dtype, ndim: int, contiguous: bool = True
) -> None:
    check(t.dtype == dtype, f"{name} must be {dtype}, got {t.dtype}")
    check(t.dim() == ndim, f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if contiguous:
        check(t.is_contiguous(), f"{name} must be contiguous, got strides {t.stride()}")
