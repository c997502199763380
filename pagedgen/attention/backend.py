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
        if not src_to_dst:
            return
        src, dst = (torch.tensor(ids, device=kv_caches[0].device) for ids in zip(*src_to_dst))
        for kv_cache in kv_caches:
            kv_cache[:, dst] = kv_cache[:, src]


def get_attention_backend(name: str, device: torch.device) -> AttentionBackend:
    if name == "auto":
        name = "torch"
        if device.type == "cuda":
            from pagedgen.attention.cupy_backend import cupy_available

            name = "cupy" if cupy_available() else "torch"
    if name == "torch":
        from pagedgen.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "reference":
        from pagedgen.attention.reference import ReferenceAttentionBackend

        return ReferenceAttentionBackend()
    if name == "cupy":
        from pagedgen.attention.cupy_backend import CupyAttentionBackend

        return CupyAttentionBackend(device)
    raise ValueError(f"unknown attention backend {name!r}; choose auto, torch, cupy or reference")
