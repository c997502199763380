import torch
import torch.nn.functional as F

from pagedgen.attention.backend import AttentionBackend
from pagedgen.attention.metadata import AttentionMetadata


def write_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens], every slot valid
) -> None:
    """Writes the step's K/V, rounded to the cache's dtype where it is narrower."""
    num_kv_heads, head_dim = key_cache.shape[2:]
    dtype = key_cache.dtype
    key_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(dtype))
    value_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(dtype))


def decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim], one query row per sequence
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, >= ceil(max_context_len / block_size)]
    context_lens: torch.Tensor,  # [num_seqs]
    max_context_len: int,
    scale: float,
) -> torch.Tensor:
    """Gathers only the blocks each sequence uses (padded to the longest) and attends once:
    one launch for the whole batch, the better trade on a GPU."""
    block_size = key_cache.shape[1]
    num_blocks = -(-max_context_len // block_size)
    blocks = block_tables[:, :num_blocks]
    # [num_seqs, num_kv_heads, num_blocks * block_size, head_dim]
    keys = key_cache[blocks].flatten(1, 2).transpose(1, 2)
    values = value_cache[blocks].flatten(1, 2).transpose(1, 2)
    positions = torch.arange(num_blocks * block_size, device=query.device)
    mask = (positions[None, :] < context_lens[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(
        query.unsqueeze(2),
        keys.to(query.dtype),
        values.to(query.dtype),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out.squeeze(2)


def decode_attention_per_seq(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim], one query row per sequence
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    seq_blocks: list[torch.Tensor],  # per sequence, the blocks of its context
    context_lens: list[int],
    scale: float,
) -> torch.Tensor:
    """One SDPA call per sequence over exactly its context: on a CPU, cheaper than padding the
    batch to its longest context, which makes SDPA take its slow masked path. Each sequence's
    blocks are gathered right before use, while they fit in cache."""
    num_kv_heads, head_dim = key_cache.shape[2:]
    dtype = sdpa_dtype(query)
    queries = query[:, None, :, None].to(dtype)  # 4-D per sequence: 3-D takes SDPA's math path
    outs = []
    for i, (blocks, context_len) in enumerate(zip(seq_blocks, context_lens)):
        keys = key_cache.index_select(0, blocks).view(1, -1, num_kv_heads, head_dim)
        values = value_cache.index_select(0, blocks).view(1, -1, num_kv_heads, head_dim)
        outs.append(
            F.scaled_dot_product_attention(
                queries[i],
                keys[:, :context_len].transpose(1, 2).to(dtype),
                values[:, :context_len].transpose(1, 2).to(dtype),
                scale=scale,
                enable_gqa=True,
            )
        )
    return torch.cat(outs).view_as(query).to(query.dtype)


def sdpa_dtype(query: torch.Tensor) -> torch.dtype:
    """The dtype SDPA computes in: torch's CPU flash kernel runs float16 2-3x slower than float32
    (it has no float16 GEMM on these CPUs), bfloat16 as fast."""
    if query.device.type == "cpu" and query.dtype == torch.float16:
        return torch.float32
    return query.dtype


def split_block_tables(
    block_tables: torch.Tensor, context_lens: list[int], block_size: int
) -> list[torch.Tensor]:
    return [block_tables[i, : -(-n // block_size)] for i, n in enumerate(context_lens)]


def prefill_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim]; rows of prefill sequences are set
) -> None:
    """Causal attention for sequences num_decode_seqs.. of the batch, one SDPA call each.

    A sequence whose whole context is new attends to this step's K/V directly; one with cached
    tokens before its queries gathers its context from the pool through its block table.
    """
    block_size = key_cache.shape[1]
    dtype = sdpa_dtype(query)
    start = metadata.num_decode_seqs
    for i in range(metadata.num_decode_seqs, metadata.num_seqs):
        query_len, context_len = metadata.query_lens_cpu[i], metadata.context_lens_cpu[i]
        end = start + query_len
        if context_len == query_len:
            keys, values, mask = key[start:end], value[start:end], None
        else:
            blocks = metadata.block_tables[i, : -(-context_len // block_size)]
            keys = key_cache[blocks].flatten(0, 1)[:context_len].to(query.dtype)
            values = value_cache[blocks].flatten(0, 1)[:context_len].to(query.dtype)
            rows = torch.arange(context_len - query_len, context_len, device=query.device)
            mask = torch.arange(context_len, device=query.device)[None, :] <= rows[:, None]
        out[start:end] = F.scaled_dot_product_attention(
            query[start:end].transpose(0, 1)[None].to(dtype),
            keys.transpose(0, 1)[None].to(dtype),
            values.transpose(0, 1)[None].to(dtype),
            attn_mask=mask,
            is_causal=mask is None,
            scale=scale,
            enable_gqa=True,
        )[0].transpose(0, 1)
        start = end


class TorchAttentionBackend(AttentionBackend):
    """PyTorch paged attention for CPU and GPU: K/V written in place, no per-step cache rebuild.
    Decode rows: one SDPA call per sequence on a CPU, one padded batch on a GPU; prefill rows:
    one SDPA call per sequence. The kernel backends override write_cache and decode."""

    name = "torch"

    def __init__(self) -> None:
        self._seq_blocks: list[torch.Tensor] = []

    def prepare(self, metadata: AttentionMetadata) -> None:
        if metadata.num_decode_seqs and metadata.block_tables.device.type == "cpu":
            context_lens = metadata.context_lens_cpu[: metadata.num_decode_seqs]
            self._seq_blocks = split_block_tables(
                metadata.block_tables, context_lens, metadata.block_size
            )

    def write_cache(self, key, value, key_cache, value_cache, slot_mapping) -> None:
        write_kv(key, value, key_cache, value_cache, slot_mapping)

    def decode(self, query, key_cache, value_cache, metadata: AttentionMetadata, scale, out):
        num_decode = metadata.num_decode_seqs
        if query.device.type == "cpu":
            out[:num_decode] = decode_attention_per_seq(
                query[:num_decode],
                key_cache,
                value_cache,
                self._seq_blocks,
                metadata.context_lens_cpu[:num_decode],
                scale,
            )
        else:
            out[:num_decode] = decode_attention(
                query[:num_decode],
                key_cache,
                value_cache,
                metadata.block_tables[:num_decode],
                metadata.context_lens[:num_decode],
                max(metadata.context_lens_cpu[:num_decode]),
                scale,
            )

    def prefill(self, query, key, value, key_cache, value_cache, metadata, scale, out) -> None:
        prefill_attention(query, key, value, key_cache, value_cache, metadata, scale, out)
