"""The only module that imports cupy: compiles kernel modules on first use and launches them."""

import functools
from typing import Any

import numpy as np
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


# Beyond this much dynamic shared memory a kernel must be allowed more, once (CUDA's default).
DEFAULT_DYNAMIC_SHARED = 48 * 1024


@functools.cache
def _kernel(module: KernelModule, name_expression: str, device_index: int, shared_mem: int) -> Any:
    import cupy

    with cupy.cuda.Device(device_index):
        kernel = _module(module, device_index).get_function(name_expression)
        if shared_mem > DEFAULT_DYNAMIC_SHARED:
            kernel.max_dynamic_shared_size_bytes = shared_mem
        return kernel


def _argument(a: object) -> object:
    # A tensor goes by its device pointer, as a 64-bit scalar passed by value: the kernel's
    # pointer parameter has that size, and it skips a DLPack conversion per tensor per launch.
    return np.uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else a


_streams: dict[tuple[int, int], Any] = {}


def _stream(device_index: int) -> Any:
    """CuPy's handle on torch's current stream, made once per stream rather than per launch."""
    import cupy

    torch_stream = torch.cuda.current_stream(device_index)
    key = (device_index, torch_stream.cuda_stream)
    stream = _streams.get(key)
    if stream is None:
        stream = _streams[key] = cupy.cuda.Stream.from_external(torch_stream)
    return stream


def launch(kernel_launch: KernelLaunch) -> None:
    """Runs the launch on torch's current stream; its tensors must be on one CUDA device."""
    import cupy

    devices = {a.device for a in kernel_launch.args if isinstance(a, torch.Tensor)}
    device = devices.pop()
    if device.type != "cuda" or devices:
        raise ValueError(f"kernel tensors must share one CUDA device, got {devices | {device}}")
    index = torch.cuda.current_device() if device.index is None else device.index
    stream = _stream(index)
    with cupy.cuda.Device(index):  # the stream goes with the call: no stream context to enter
        shared_mem = kernel_launch.shared_mem
        kernel = _kernel(kernel_launch.module, kernel_launch.name_expression, index, shared_mem)
        args = tuple(map(_argument, kernel_launch.args))
        kernel(kernel_launch.grid, kernel_launch.block, args, shared_mem=shared_mem, stream=stream)


def copy_async(dst_ptr: int, src_ptr: int, num_bytes: int, stream_ptr: int) -> None:
    import cupy

    cupy.cuda.runtime.memcpyAsync(
        dst_ptr, src_ptr, num_bytes, cupy.cuda.runtime.memcpyDefault, stream_ptr
    )


def peak_memory_bandwidth(device_index: int) -> float:
    """Bytes/s at the device's peak: memory clock (kHz) x bus width (bits) x 2 (double data
    rate) / 8."""
    import cupy

    attribute = cupy.cuda.runtime.deviceGetAttribute
    clock_khz = attribute(cupy.cuda.runtime.cudaDevAttrMemoryClockRate, device_index)
    bus_bits = attribute(cupy.cuda.runtime.cudaDevAttrGlobalMemoryBusWidth, device_index)
    return clock_khz * 1e3 * bus_bits * 2 / 8


@functools.cache
def max_dynamic_shared_memory(device_index: int) -> int:
    """The most shared memory a block of the device may have (cudaDevAttrMaxSharedMemoryPerBlock
    Optin): 227 KB on an H100, 163 KB on an A100, 99 KB on sm_86 and sm_89."""
    import cupy

    optin = 97  # cudaDevAttrMaxSharedMemoryPerBlockOptin
    return cupy.cuda.runtime.deviceGetAttribute(optin, device_index)
