import torch

from pagedgen.attention.backend import AttentionBackend
from pagedgen.attention.kv_cache_dtype import (
    gather,
    round_through_cache,
    to_cache_dtype,
    writable,
)
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.sdpa import alibi_bias, attention, sdpa_dtype
from pagedgen.attention.spec import AttentionSpec, spec_options


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
    for cache, x in ((key_cache, key), (value_cache, value)):
        rows = writable(to_cache_dtype(x, dtype))
        writable(cache).view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, rows)


def window_start(context_len: int, num_queries: int, window: int | None) -> int:
    """The first position any of the last num_queries queries of a context may see."""
    if window is None:
        return 0
    return max(0, context_len - num_queries - window + 1)


def decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim], one query row per sequence
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, >= ceil(max_context_len / block_size)]
    context_lens: torch.Tensor,  # [num_seqs]
    max_context_len: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gathers only the blocks each sequence uses (padded to the longest) and attends once:
    one launch for the whole batch, the better trade on a GPU."""
    block_size = key_cache.shape[1]
    num_blocks = -(-max_context_len // block_size)
    blocks = block_tables[:, :num_blocks]
    # [num_seqs, num_kv_heads, num_blocks * block_size, head_dim]
    shape, index = (*blocks.shape, *key_cache.shape[1:]), blocks.flatten().clamp(min=0)
    keys = gather(key_cache, index).view(shape).flatten(1, 2).transpose(1, 2)
    values = gather(value_cache, index).view(shape).flatten(1, 2).transpose(1, 2)
    positions = torch.arange(num_blocks * block_size, device=query.device)
    mask = positions[None, :] < context_lens[:, None]
    if window is not None:  # blocks out of the window may be freed (id -1, read as 0): masked
        mask &= positions[None, :] >= context_lens[:, None] - window
    out = attention(
        query.unsqueeze(2),
        keys.to(query.dtype),
        values.to(query.dtype),
        scale,
        mask[:, None, None, :],
        softcap=softcap,
        sinks=sinks,
        bias=alibi_bias(alibi_slopes, context_lens[:, None] - 1, positions),
    )
    return out.squeeze(2)


def decode_attention_per_seq(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim], one query row per sequence
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    seq_blocks: list[torch.Tensor],  # per sequence, the blocks of its context
    context_lens: list[int],
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """One SDPA call per sequence over exactly its context (its last window tokens): on a CPU,
    cheaper than padding the batch to its longest context, which makes SDPA take its slow
    masked path. Each sequence's blocks are gathered right before use, while they fit in cache."""
    num_kv_heads, head_dim = key_cache.shape[2:]
    block_size = key_cache.shape[1]
    dtype = sdpa_dtype(query)
    queries = query[:, None, :, None].to(dtype)  # 4-D per sequence: 3-D takes SDPA's math path
    outs = []
    for i, (blocks, context_len) in enumerate(zip(seq_blocks, context_lens)):
        first = window_start(context_len, 1, window)
        first_block = first // block_size
        blocks = blocks[first_block:]
        first, end = first - first_block * block_size, context_len - first_block * block_size
        keys = gather(key_cache, blocks).view(1, -1, num_kv_heads, head_dim)
        values = gather(value_cache, blocks).view(1, -1, num_kv_heads, head_dim)
        key_positions = torch.arange(first - context_len + 1, 1, device=query.device)
        outs.append(
            attention(
                queries[i],
                keys[:, first:end].transpose(1, 2).to(dtype),
                values[:, first:end].transpose(1, 2).to(dtype),
                scale,
                softcap=softcap,
                sinks=sinks,
                bias=alibi_bias(alibi_slopes, key_positions.new_zeros(1), key_positions),
            )
        )
    return torch.cat(outs).view_as(query).to(query.dtype)


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
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> None:
    """Causal attention for sequences num_decode_seqs.. of the batch, one SDPA call each."""
    options = (scale, window, softcap, sinks, alibi_slopes)
    start = metadata.num_decode_seqs
    for i in range(metadata.num_decode_seqs, metadata.num_seqs):
        end = start + metadata.query_lens_cpu[i]
        rows = (query[start:end], key[start:end], value[start:end])
        context = (key_cache, value_cache, metadata.block_tables[i], metadata.context_lens_cpu[i])
        out[start:end] = prefill_sequence(*rows, *context, *options)
        start = end


def prefill_sequence(
    query: torch.Tensor,  # [query_len, num_heads, head_dim]: the last rows of the context
    key: torch.Tensor,  # [query_len, num_kv_heads, head_dim], written to the cache already
    value: torch.Tensor,
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,
    block_table: torch.Tensor,  # [>= ceil(context_len / block_size)]
    context_len: int,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:  # [query_len, num_heads, head_dim]
    """One sequence's causal attention in one SDPA call. A sequence whose whole context is new
    attends to this step's K/V directly; one with cached tokens before its queries gathers its
    context from the pool through its block table, from the first block its window reaches
    (blocks before it may be freed)."""
    block_size, query_len = key_cache.shape[1], query.shape[0]
    dtype = sdpa_dtype(query)
    first = window_start(context_len, query_len, window)
    if context_len == query_len:  # as the cache holds them, as later steps will read them
        keys = round_through_cache(key, key_cache.dtype)
        values = round_through_cache(value, value_cache.dtype)
        first = 0
    else:
        first_block = first // block_size
        blocks = block_table[first_block : -(-context_len // block_size)]
        span = slice(first - first_block * block_size, context_len - first_block * block_size)
        keys = gather(key_cache, blocks).flatten(0, 1)[span].to(query.dtype)
        values = gather(value_cache, blocks).flatten(0, 1)[span].to(query.dtype)
    mask = bias = None
    if window is not None or context_len != query_len or alibi_slopes is not None:
        rows = torch.arange(context_len - query_len, context_len, device=query.device)
        cols = torch.arange(first, context_len, device=query.device)
        bias = alibi_bias(alibi_slopes, rows, cols)
    if window is not None or context_len != query_len:
        mask = cols[None, :] <= rows[:, None]
        if window is not None:
            mask &= cols[None, :] > rows[:, None] - window
    return attention(
        query.transpose(0, 1)[None].to(dtype),
        keys.transpose(0, 1)[None].to(dtype),
        values.transpose(0, 1)[None].to(dtype),
        scale,
        mask,
        is_causal=mask is None,
        softcap=softcap,
        sinks=sinks,
        bias=bias,
    )[0].transpose(0, 1)


class TorchAttentionBackend(AttentionBackend):
    """PyTorch paged attention for CPU and GPU: K/V written in place, no per-step cache rebuild.
    Decode rows: one SDPA call per sequence on a CPU, one padded batch on a GPU; prefill rows:
    one SDPA call per sequence. The kernel backends override write_cache and decode."""

    name = "torch"

    def __init__(self) -> None:
        self._seq_blocks: list[torch.Tensor] | None = None  # this step's, made on first use

    def prepare(self, metadata: AttentionMetadata) -> None:
        self._seq_blocks = None

    def _decode_seq_blocks(self, metadata: AttentionMetadata) -> list[torch.Tensor]:
        """Each decode row's blocks, split once a step for every layer that decodes here."""
        if self._seq_blocks is None:
            context_lens = metadata.context_lens_cpu[: metadata.num_decode_seqs]
            self._seq_blocks = split_block_tables(
                metadata.block_tables, context_lens, metadata.block_size
            )
        return self._seq_blocks

    def write_cache(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        write_kv(key, value, key_cache, value_cache, slot_mapping)

    def decode(
        self,
        spec: AttentionSpec,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        metadata: AttentionMetadata,
        out: torch.Tensor,
    ) -> None:
        n = metadata.num_decode_seqs
        options = spec_options(spec)
        if query.device.type == "cpu":
            blocks, lens = self._decode_seq_blocks(metadata), metadata.context_lens_cpu[:n]
            out[:n] = decode_attention_per_seq(
                query[:n], key_cache, value_cache, blocks, lens, spec.scale, **options
            )
        else:
            tables, lens = metadata.block_tables[:n], metadata.context_lens[:n]
            max_len = max(metadata.context_lens_cpu[:n])
            args = (query[:n], key_cache, value_cache, tables, lens, max_len, spec.scale)
            out[:n] = decode_attention(*args, **options)

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
        cache = (key_cache, value_cache, metadata, spec.scale, out)
        prefill_attention(query, key, value, *cache, **spec_options(spec))
