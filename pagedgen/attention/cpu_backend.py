import torch

from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.torch_backend import TorchAttentionBackend
from pagedgen.kernels.cpu import cpu_kernel_error, kernel_dtypes, paged_attention_decode


class CpuAttentionBackend(TorchAttentionBackend):
    """The torch backend with decode rows served by our C kernel: one call per layer for the
    whole batch, reading each sequence's blocks in place, where the torch path gathers them and
    calls SDPA once per sequence. The kernel reads float32, bfloat16 and float16 caches and
    computes in float32; a half-precision query and output are converted around it (a model that
    computes in float32 over a half-precision cache passes straight through)."""

    name = "cpu"

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        if device.type != "cpu":
            raise RuntimeError(f"the cpu attention backend runs on the CPU only, got {device}")
        error = cpu_kernel_error()
        if error is not None:
            raise RuntimeError(f"the cpu attention kernel is unavailable: {error}")

    def decode(
        self,
        query,
        key_cache,
        value_cache,
        metadata: AttentionMetadata,
        scale,
        out,
        window: int | None = None,
        softcap: float | None = None,
    ):
        if key_cache.dtype not in kernel_dtypes():
            return super().decode(
                query, key_cache, value_cache, metadata, scale, out, window, softcap
            )
        num_decode = metadata.num_decode_seqs
        query = query[:num_decode]
        if query.dtype == torch.float32:
            result = out[:num_decode]
        else:
            query = query.float()
            result = torch.empty(query.shape, dtype=torch.float32)
        paged_attention_decode(
            result,
            query,
            key_cache,
            value_cache,
            metadata.block_tables,
            metadata.context_lens,
            scale,
            window=window,
            softcap=softcap,
        )
        if result.data_ptr() != out.data_ptr():
            out[:num_decode] = result
