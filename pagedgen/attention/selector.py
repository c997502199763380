"""Which attention backend a model runs on: one pure choice over the device, the head size and
the block size, and the backend built for it."""

import torch

from pagedgen.attention.backend import AttentionBackend
from pagedgen.attention.cpu_backend import CpuAttentionBackend
from pagedgen.attention.cupy_backend import CupyAttentionBackend, cupy_available
from pagedgen.attention.reference import ReferenceAttentionBackend
from pagedgen.attention.torch_backend import TorchAttentionBackend
from pagedgen.config import CudaAttentionConfig
from pagedgen.kernels.cpu import cpu_kernel_error


def get_attention_backend(
    name: str,
    device: torch.device,
    head_size: int,
    block_size: int,
    cuda_options: CudaAttentionConfig = CudaAttentionConfig(),
) -> AttentionBackend:
    """auto: our CUDA kernels on a CUDA device when CuPy works and they cover the shapes; our C
    decode kernel on the CPU when it compiles here; else the torch backend."""
    if name == "auto":
        name = "torch"
        if device.type == "cpu" and cpu_kernel_error() is None:
            name = "cpu"
        elif (
            device.type == "cuda"
            and cupy_available()
            and CupyAttentionBackend.supports(head_size, block_size)
        ):
            name = "cupy"
    if name == "torch":
        return TorchAttentionBackend()
    if name == "cpu":
        return CpuAttentionBackend(device)
    if name == "reference":
        return ReferenceAttentionBackend()
    if name == "cupy":
        return CupyAttentionBackend(device, head_size, block_size, cuda_options)
    raise ValueError(
        f"unknown attention backend {name!r}; choose auto, torch, cpu, cupy or reference"
    )
