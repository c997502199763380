import torch

from pagedgen.attention.backend import split_qkv
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.torch_backend import TorchAttentionBackend
from pagedgen.kernels import cpu_ops
from pagedgen.kernels.cpu import (
    ACTIVATION_DTYPES,
    cpu_kernel_error,
    kernel_dtypes,
    paged_attention_decode,
)
from pagedgen.layers.rotary import Rope

# A step prefilling a longer sequence over a float32 cache takes SDPA (see prefill).
MAX_KERNEL_PREFILL_FLOAT32 = 1024


class CpuAttentionBackend(TorchAttentionBackend):
    """The torch backend with decode and prefill rows served by our C kernel: one call per layer
    for the whole batch, reading each sequence's blocks in place, where the torch path gathers
    them and calls SDPA once per sequence. The kernel reads float32, bfloat16 and float16 caches
    and computes in float32; it takes a float32 or bfloat16 query and output as they are, a
    float16 one converted around it."""

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
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """RoPE and the cache write in one C pass over the QKV rows (float32), then attention
        on q, k and v as views of those rows."""
        if not (cpu_ops.usable(qkv) and qkv.stride(1) == 1):
            args = (num_heads, num_kv_heads, rope, key_cache, value_cache, metadata, scale)
            return super().forward_qkv(qkv, *args, window, softcap, sinks)
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
        return self.attend(q, k, v, key_cache, value_cache, metadata, scale, window, softcap, sinks)

    def prepare(self, metadata: AttentionMetadata) -> None:
        super().prepare(metadata)
        self._prefill_rows: tuple[torch.Tensor, torch.Tensor] | None = None

    def _prefill_tables(self, metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """Each prefill query row as a decode row of its own: its sequence's block table and its
        causal context length (its position + 1). Made once a step, for every layer."""
        if self._prefill_rows is None:
            first, num_seqs = metadata.num_decode_seqs, metadata.num_seqs
            query_lens = metadata.query_lens_cpu[first:]
            context_lens = metadata.context_lens_cpu[first:]
            rows = torch.repeat_interleave(
                torch.arange(first, num_seqs), torch.tensor(query_lens, dtype=torch.int64)
            )
            lens = [p + 1 for q, c in zip(query_lens, context_lens) for p in range(c - q, c)]
            tables = metadata.block_tables.index_select(0, rows)
            self._prefill_rows = tables, torch.tensor(lens, dtype=torch.int32)
        return self._prefill_rows

    def _attend_rows(
        self, query, key_cache, value_cache, tables, lens, scale, out, window, softcap, sinks
    ):
        """The C kernel over query rows (each with its block table and context length), out
        being the matching rows of the step's output."""
        if query.dtype in ACTIVATION_DTYPES:
            result = out
        else:  # float16
            query = query.float()
            result = torch.empty(query.shape, dtype=torch.float32)
        paged_attention_decode(
            result,
            query,
            key_cache,
            value_cache,
            tables,
            lens,
            scale,
            window=window,
            softcap=softcap,
            sinks=None if sinks is None else sinks.float().contiguous(),
        )
        if result.data_ptr() != out.data_ptr():
            out.copy_(result)

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
        sinks: torch.Tensor | None = None,
    ):
        if key_cache.dtype not in kernel_dtypes():
            return super().decode(
                query, key_cache, value_cache, metadata, scale, out, window, softcap, sinks
            )
        n = metadata.num_decode_seqs
        tables, lens = metadata.block_tables, metadata.context_lens
        self._attend_rows(
            query[:n], key_cache, value_cache, tables, lens, scale, out[:n], window, softcap, sinks
        )

    def prefill(
        self,
        query,
        key,
        value,
        key_cache,
        value_cache,
        metadata: AttentionMetadata,
        scale,
        out,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        """Prefill rows through the decode kernel, each query row attending to its causal
        context in the cache (this step's K/V are written already). Against one SDPA call per
        sequence (AVX-512, SmolLM2's heads): 1.6-2.5x faster up to 300 tokens, as fast at 1000;
        past that SDPA's matmuls win in float32 (1.4x at 4000 tokens), not in bfloat16."""
        long_float32 = query.dtype == torch.float32 and (
            max(metadata.query_lens_cpu[metadata.num_decode_seqs :]) > MAX_KERNEL_PREFILL_FLOAT32
        )
        if key_cache.dtype not in kernel_dtypes() or long_float32:
            args = (query, key, value, key_cache, value_cache, metadata, scale, out)
            return super().prefill(*args, window, softcap, sinks)
        n = metadata.num_decode_seqs
        tables, lens = self._prefill_tables(metadata)
        self._attend_rows(
            query[n:], key_cache, value_cache, tables, lens, scale, out[n:], window, softcap, sinks
        )
