"""Backend calls for tests that attend over loose tensors: the layer's AttentionSpec is read off
the query and key shapes and the options given."""

import torch

from pagedgen.attention import AttentionBackend, AttentionMetadata
from pagedgen.attention.spec import AttentionSpec
from pagedgen.layers.rotary import Rope


def spec_for(
    query: torch.Tensor,  # [num_tokens, num_heads, head_size]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> AttentionSpec:
    num_heads, head_size = query.shape[1:]
    return AttentionSpec(
        num_heads, key.shape[1], head_size, scale, window, softcap, sinks, alibi_slopes
    )


def forward(
    backend: AttentionBackend,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    spec = spec_for(query, key, scale, window, softcap, sinks, alibi_slopes)
    return backend.forward(spec, query, key, value, key_cache, value_cache, metadata)


def forward_qkv(
    backend: AttentionBackend,
    qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_size]
    num_heads: int,
    num_kv_heads: int,
    rope: Rope | None,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    head_size = key_cache.shape[-1]
    options = (window, softcap, sinks, alibi_slopes)
    spec = AttentionSpec(num_heads, num_kv_heads, head_size, scale, *options)
    return backend.forward_qkv(spec, qkv, rope, key_cache, value_cache, metadata)
