import torch

from pagedgen.attention.backend import split_qkv
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.torch_backend import TorchAttentionBackend
from pagedgen.kernels import cpu_ops
from pagedgen.kernels.cpu import cpu_kernel_error, kernel_dtypes, paged_attention_decode
from pagedgen.layers.rotary import Rope


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

    def forward_qkv(
        self,
        qkv: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        rope: Rope,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """RoPE and the cache write in one C pass over the QKV rows (float32), then attention
        on q, k and v as views of those rows."""
        if not (cpu_ops.usable(qkv) and qkv.stride(1) == 1):
            args = (num_heads, num_kv_heads, rope, key_cache, value_cache, metadata, scale)
            return super().forward_qkv(qkv, *args, window, softcap)
        num_tokens = qkv.shape[0]
        cpu_ops.rotary_embedding_and_cache(
            qkv,
            rope.cos.view(num_tokens, -1),
            rope.sin.view(num_tokens, -1),
            num_heads,
            num_kv_heads,
            key_cache,
            value_cache,
            metadata.slot_mapping,
        )
        q, k, v = split_qkv(qkv, num_heads, num_kv_heads)
        return self.attend(q, k, v, key_cache, value_cache, metadata, scale, window, softcap)

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
