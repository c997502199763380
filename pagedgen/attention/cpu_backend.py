import torch

from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.torch_backend import TorchAttentionBackend
from pagedgen.kernels.cpu import cpu_kernel_error, paged_attention_decode


class CpuAttentionBackend(TorchAttentionBackend):
    """The torch backend with decode rows served by our C kernel: one call per layer for the
    whole batch, reading each sequence's blocks in place, where the torch path gathers them and
    calls SDPA once per sequence. float32 only; other dtypes take the torch path."""

    name = "cpu"

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        if device.type != "cpu":
            raise RuntimeError(f"the cpu attention backend runs on the CPU only, got {device}")
        error = cpu_kernel_error()
        if error is not None:
            raise RuntimeError(f"the cpu attention kernel is unavailable: {error}")

    def decode(self, query, key_cache, value_cache, metadata: AttentionMetadata, scale, out):
        if query.dtype != torch.float32:
            return super().decode(query, key_cache, value_cache, metadata, scale, out)
        num_decode = metadata.num_decode_seqs
        paged_attention_decode(
            out[:num_decode],
            query[:num_decode],
            key_cache,
            value_cache,
            metadata.block_tables,
            metadata.context_lens,
            scale,
        )
