from abc import ABC, abstractmethod

import torch

from pagedgen.attention.metadata import AttentionMetadata


class AttentionBackend(ABC):
    """Writes a step's new K/V into the paged cache and attends through the block tables.

    Cache layout, shared by every backend so they can read the same pool:
        key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    """

    name: str

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...

    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: list[tuple[int, int]]) -> None:
        """Copies whole blocks inside each layer's [2, num_blocks, ...] cache (copy-on-write)."""
        src, dst = (torch.tensor(ids, device=kv_caches[0].device) for ids in zip(*src_to_dst))
        for kv_cache in kv_caches:
            kv_cache[:, dst] = kv_cache[:, src]

    def swap_blocks(
        self,
        src_caches: list[torch.Tensor],  # per layer [2, num_src_blocks, ...]
        dst_caches: list[
            torch.Tensor
        ],  # per layer [2, num_dst_blocks, ...], maybe on another device
        src_to_dst: list[tuple[int, int]],
    ) -> None:
        """Copies blocks between the device pool and the CPU pool, in either direction."""
        src, dst = (list(ids) for ids in zip(*src_to_dst))
        src_index = torch.tensor(src, device=src_caches[0].device)
        dst_index = torch.tensor(dst, device=dst_caches[0].device)
        for src_cache, dst_cache in zip(src_caches, dst_caches):
            blocks = src_cache.index_select(1, src_index).to(dst_cache.device, non_blocking=True)
            dst_cache.index_copy_(1, dst_index, blocks)


def get_attention_backend(
    name: str, device: torch.device, head_size: int, block_size: int
) -> AttentionBackend:
    """auto: our CUDA kernels on a CUDA device when CuPy works and they cover the shapes; our C
    decode kernel on the CPU when it compiles here; else the torch backend."""
    if name == "auto":
        name = "torch"
        if device.type == "cpu":
            from pagedgen.kernels.cpu import cpu_kernel_error

            if cpu_kernel_error() is None:
                name = "cpu"
        elif device.type == "cuda":
            from pagedgen.attention.cupy_backend import CupyAttentionBackend, cupy_available

            if cupy_available() and CupyAttentionBackend.supports(head_size, block_size):
                name = "cupy"
    if name == "torch":
        from pagedgen.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "cpu":
        from pagedgen.attention.cpu_backend import CpuAttentionBackend

        return CpuAttentionBackend(device)
    if name == "reference":
        from pagedgen.attention.reference import ReferenceAttentionBackend

        return ReferenceAttentionBackend()
    if name == "cupy":
        from pagedgen.attention.cupy_backend import CupyAttentionBackend

        return CupyAttentionBackend(device)
    raise ValueError(
        f"unknown attention backend {name!r}; choose auto, torch, cpu, cupy or reference"
    )
