"""Attention on gathered K/V with torch: SDPA, or, for what SDPA lacks (soft caps, sinks, an
additive float32 bias such as ALiBi's), the same computed by hand in float32."""

import torch
import torch.nn.functional as F


def attention(
    query: torch.Tensor,  # [batch, num_heads, num_queries, head_dim]
    key: torch.Tensor,  # [batch, num_kv_heads, num_keys, head_dim]
    value: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,  # [.., num_queries, num_keys] bool, True = attend
    is_causal: bool = False,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,  # [.., num_heads, num_queries, num_keys] float32
) -> torch.Tensor:
    """SDPA, or with a soft cap on the scores (Gemma 2: softcap * tanh(scores / softcap)), sinks
    (gpt-oss: one more logit per head in the softmax, a key of zero value) or a bias added after
    any cap (ALiBi's), the same computed in float32 by hand (SDPA has no cap or sinks, and would
    take the bias in the query's dtype)."""
    if softcap is None and sinks is None and bias is None:
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=True
        )
    group = query.shape[1] // key.shape[1]
    key = key.float().repeat_interleave(group, dim=1)
    value = value.float().repeat_interleave(group, dim=1)
    scores = (query.float() @ key.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    if is_causal:
        num_queries, num_keys = scores.shape[-2:]
        mask = torch.ones(num_queries, num_keys, dtype=torch.bool, device=scores.device).tril(
            num_keys - num_queries
        )
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1)
    else:
        sink = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    return (probs @ value).to(query.dtype)


def alibi_bias(
    alibi_slopes: torch.Tensor | None,  # [num_heads]
    query_positions: torch.Tensor,  # [.., num_queries]
    key_positions: torch.Tensor,  # [.., num_keys]
) -> torch.Tensor | None:  # [.., num_heads, num_queries, num_keys] float32
    """ALiBi's scores: slope * (key position - query position)."""
    if alibi_slopes is None:
        return None
    distance = key_positions[..., None, None, :] - query_positions[..., None, :, None]
    return alibi_slopes.float().view(-1, 1, 1) * distance.float()


def sdpa_dtype(query: torch.Tensor) -> torch.dtype:
    """The dtype SDPA computes in: torch's CPU flash kernel runs float16 2-3x slower than float32
    (it has no float16 GEMM on these CPUs), bfloat16 as fast."""
    if query.device.type == "cpu" and query.dtype == torch.float16:
        return torch.float32
    return query.dtype
