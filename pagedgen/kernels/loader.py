"""The only module that imports cupy: compiles kernel modules on first use and launches them."""

import functools
from typing import Any

import torch

from pagedgen.kernels.launch import KernelLaunch, KernelModule
from pagedgen.kernels.source import kernel_source


def cupy_available() -> bool:
    """CuPy imports and sees at least one GPU."""
    try:
        import cupy
    except ImportError:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


@functools.cache
def _module(module: KernelModule, device_index: int) -> Any:
    import cupy

    with cupy.cuda.Device(device_index):
        return cupy.RawModule(
            code=kernel_source(module.source),
            options=module.options,
            name_expressions=module.name_expressions,
        )


@functools.cache
def _kernel(module: KernelModule, name_expression: str, device_index: int) -> Any:
    import cupy

    with cupy.cuda.Device(device_index):
        return _module(module, device_index).get_function(name_expression)


def _as_cupy(t: torch.Tensor) -> Any:
    import cupy

    # CuPy has no bfloat16; the kernel only needs the pointer, so hand over the same bytes as int16.
    return cupy.from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def launch(kernel_launch: KernelLaunch) -> None:
    """Runs the launch on torch's current stream; its tensors must be on one CUDA device."""
    import cupy

    devices = {a.device for a in kernel_launch.args if isinstance(a, torch.Tensor)}
    device = devices.pop()
    if device.type != "cuda" or devices:
        raise ValueError(f"kernel tensors must share one CUDA device, got {devices | {device}}")
    index = torch.cuda.current_device() if device.index is None else device.index
    stream = cupy.cuda.Stream.from_external(torch.cuda.current_stream(index))
    with cupy.cuda.Device(index), stream:
        kernel = _kernel(kernel_launch.module, kernel_launch.name_expression, index)
        args = tuple(_as_cupy(a) if isinstance(a, torch.Tensor) else a for a in kernel_launch.args)
        kernel(kernel_launch.grid, kernel_launch.block, args)


def copy_async(dst_ptr: int, src_ptr: int, num_bytes: int, stream_ptr: int) -> None:
    import cupy

    cupy.cuda.runtime.memcpyAsync(
        dst_ptr, src_ptr, num_bytes, cupy.cuda.runtime.memcpyDefault, stream_ptr
    )
