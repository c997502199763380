from abc import ABC, abstractmethod

import torch

from pagedgen.attention.kv_cache_dtype import gather, writable
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.spec import AttentionSpec
from pagedgen.kernels.host_copy import to_device
from pagedgen.layers.rotary import Rope


class AttentionBackend(ABC):
    """Writes a step's new K/V into the paged cache and attends through the block tables.

    Cache layout, shared by every backend so they can read the same pool:
        key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]

    One backend serves every layer of a model; each layer passes its AttentionSpec (its
    constants: heads, scale, sliding window, soft cap, sinks, ALiBi slopes), built once. The
    runner calls prepare(metadata) once per step; then every layer calls forward(), which
    writes the step's K/V and serves the decode rows (the first num_decode_seqs sequences, one
    query row each) and the prefill rows (the rest). Backends implement those three parts.
    """

    name: str

    def prepare(self, metadata: AttentionMetadata) -> None:  # noqa: B027 (optional hook)
        """Per-step state shared by every layer, computed once before the first."""

    def forward(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        self.write_cache(key, value, key_cache, value_cache, metadata.slot_mapping)
        return self.attend(spec, query, key, value, key_cache, value_cache, metadata)

    def forward_qkv(
        self,
        spec: AttentionSpec,
        qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]
        rope: Rope | None,  # None: no positional rotation (GPT-2, NoPE layers)
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """forward() from a fused QKV projection, RoPE (of all of each head or its first
        rope.rotary_dim features) applied to q and k first. Backends may fuse RoPE with the
        cache write (the cpu backend does)."""
        q, k, v = split_qkv(qkv, spec.num_heads, spec.num_kv_heads)
        if rope is not None:
            q, k = rope.apply(q), rope.apply(k)
        return self.forward(spec, q, k, v, key_cache, value_cache, metadata)

    def attend(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], written
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        out: torch.Tensor | None = None,  # contiguous, query's shape; None: a new tensor
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Decode and prefill rows of a step whose K/V are in the cache already."""
        if out is None:
            out = torch.empty_like(query, memory_format=torch.contiguous_format)
        if metadata.num_decode_seqs:
            self.decode(spec, query, key_cache, value_cache, metadata, out)
        if metadata.num_decode_seqs < metadata.num_seqs:
            self.prefill(spec, query, key, value, key_cache, value_cache, metadata, out)
        return out

    @abstractmethod
    def write_cache(
        self,
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,  # [num_tokens] int64, every slot valid
    ) -> None:
        """Writes token i's K and V at flat slot slot_mapping[i] (rounded to the cache dtype)."""

    @abstractmethod
    def decode(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        out: torch.Tensor,  # [num_tokens, num_heads, head_dim]: sets rows :num_decode_seqs
    ) -> None:
        """Attention of the decode rows over their contexts in the cache (K/V written). With a
        sliding window, blocks before it may be freed: their block table entries (-1) are never
        read."""

    @abstractmethod
    def prefill(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        out: torch.Tensor,  # [num_tokens, num_heads, head_dim]: sets the prefill rows
    ) -> None:
        """Causal attention of the prefill rows: this step's K/V and any cached context."""

    def copy_blocks(self, kv_caches: list[torch.Tensor], src_to_dst: list[tuple[int, int]]) -> None:
        """Copies whole blocks inside each layer's [2, num_blocks, ...] cache (copy-on-write)."""
        src, dst = (to_device(ids, torch.int64, kv_caches[0].device) for ids in zip(*src_to_dst))
        for kv_cache in kv_caches:
            writable(kv_cache)[:, dst] = writable(kv_cache)[:, src]

    def swap_blocks(
        self,
        src_caches: list[torch.Tensor],  # per layer [2, num_src_blocks, ...]
        dst_caches: list[torch.Tensor],  # per layer [2, num_dst_blocks, ...], maybe elsewhere
        src_to_dst: list[tuple[int, int]],
    ) -> None:
        """Copies blocks between the device pool and the CPU pool, in either direction."""
        src, dst = zip(*src_to_dst)
        src_index = to_device(src, torch.int64, src_caches[0].device)
        dst_index = to_device(dst, torch.int64, dst_caches[0].device)
        for src_cache, dst_cache in zip(src_caches, dst_caches):
            blocks = gather(src_cache, src_index, dim=1)
            # Only toward a GPU may the copy be non-blocking: one toward the host returns before
            # its data has landed, and index_copy_ on the host would read it at once.
            blocks = blocks.to(dst_cache.device, non_blocking=dst_cache.device.type != "cpu")
            writable(dst_cache).index_copy_(1, dst_index, writable(blocks))


def split_qkv(
    qkv: torch.Tensor, num_heads: int, num_kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Views [num_tokens, num_heads | num_kv_heads | num_kv_heads heads of head_dim] of fused
    QKV rows."""
    num_tokens = qkv.shape[0]
    head_dim = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    q, k, v = qkv.split_with_sizes(
        [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1
    )
    return (
        q.view(num_tokens, num_heads, head_dim),
        k.view(num_tokens, num_kv_heads, head_dim),
        v.view(num_tokens, num_kv_heads, head_dim),
    )
