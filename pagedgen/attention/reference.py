import torch

from pagedgen.attention.backend import AttentionBackend
from pagedgen.attention.kv_cache_dtype import to_cache_dtype
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.spec import AttentionSpec, spec_options


def write_kv_reference(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens], -1 = skip
) -> None:
    block_size = key_cache.shape[1]
    key, value = to_cache_dtype(key, key_cache.dtype), to_cache_dtype(value, value_cache.dtype)
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        key_cache[slot // block_size, slot % block_size] = key[i]
        value_cache[slot // block_size, slot % block_size] = value[i]


def paged_attention_reference(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    block_tables: list[list[int]],
    context_lens: list[int],
    query_lens: list[int],
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Token by token gather through the block table, then plain causal softmax attention; with
    a window, query position q sees positions q - window < p <= q (earlier blocks unread); with
    sinks, head h's softmax takes sinks[h] as one more score, of a zero value row; with ALiBi,
    head h's score of position p gains alibi_slopes[h] * (p - q), after any soft cap."""
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    num_heads = query.shape[1]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    row = 0
    for block_table, context_len, query_len in zip(block_tables, context_lens, query_lens):
        first = 0 if window is None else max(0, context_len - query_len - window + 1)
        positions = range(first, context_len)
        keys = torch.stack(
            [key_cache[block_table[p // block_size], p % block_size] for p in positions]
        )
        values = torch.stack(
            [value_cache[block_table[p // block_size], p % block_size] for p in positions]
        )
        for j in range(query_len):
            end = context_len - query_len + j + 1  # positions first..end - 1 may be visible
            begin = 0 if window is None else max(0, end - window) - first
            for h in range(num_heads):
                k = keys[begin : end - first, h // group].float()
                v = values[begin : end - first, h // group].float()
                scores = (k @ query[row + j, h].float()) * scale
                if softcap is not None:
                    scores = torch.tanh(scores / softcap) * softcap
                if alibi_slopes is not None:
                    distance = torch.arange(begin + first - end + 1, 1, dtype=torch.float32)
                    scores = scores + alibi_slopes[h].float() * distance
                if sinks is not None:
                    scores = torch.cat((scores, sinks[h].float().view(1)))
                    v = torch.cat((v, v.new_zeros(1, v.shape[1])))
                out[row + j, h] = (torch.softmax(scores, dim=0) @ v).to(query.dtype)
        row += query_len
    return out


class ReferenceAttentionBackend(AttentionBackend):
    """Slow and obviously correct; the yardstick for every other backend."""

    name = "reference"

    def write_cache(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        write_kv_reference(key, value, key_cache, value_cache, slot_mapping)

    def decode(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        out: torch.Tensor,
    ) -> None:
        seqs = (0, metadata.num_decode_seqs)
        self._attend(spec, query, key_cache, value_cache, metadata, out, *seqs)

    def prefill(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        out: torch.Tensor,
    ) -> None:
        seqs = (metadata.num_decode_seqs, metadata.num_seqs)
        self._attend(spec, query, key_cache, value_cache, metadata, out, *seqs)

    @staticmethod
    def _attend(
        spec: AttentionSpec,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        out: torch.Tensor,
        first: int,
        last: int,
    ) -> None:
        """Sequences first..last of the batch, over the cache (their K/V are written)."""
        seqs = slice(first, last)
        rows = metadata.cu_seqlens_q.tolist()
        start, end = rows[first], rows[last]
        out[start:end] = paged_attention_reference(
            query[start:end],
            key_cache,
            value_cache,
            metadata.block_tables[seqs].tolist(),
            metadata.context_lens_cpu[seqs],
            metadata.query_lens_cpu[seqs],
            spec.scale,
            **spec_options(spec),
        )
