"""ALiBi (Press et al., "Train Short, Test Long"): no position embedding; head h's score for a
key d positions before the query gains -slope[h] * d. The attention backends take the slopes as
alibi_slopes ([num_heads] float32) and add slope * (key position - query position) to each
scaled score; BLOOM's and MPT's are computed as transformers does, op for op, equal to the
bit."""

import math

import torch


def bloom_alibi_slopes(num_heads: int) -> torch.Tensor:
    """BLOOM's slopes (transformers' build_alibi_tensor): for n, the power of two at or below
    num_heads, base ** 1..n with base 2 ** (-8 / n); the heads past n take the odd powers of the
    base for 2n, 2 ** (-4 / n): 1, 3, 5, ... [num_heads] float32 on the CPU."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32, device="cpu")
    powers = torch.arange(1, 1 + closest, dtype=torch.int32, device="cpu")
    slopes = torch.pow(base, powers)
    if closest != num_heads:
        extra_base = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
        extra_base = torch.tensor(extra_base, dtype=torch.float32, device="cpu")
        remaining = min(closest, num_heads - closest)
        extra_powers = torch.arange(1, 1 + 2 * remaining, 2, dtype=torch.int32, device="cpu")
        slopes = torch.cat([slopes, torch.pow(extra_base, extra_powers)])
    return slopes


def falcon_alibi_slopes(num_heads: int, head_dim: int) -> torch.Tensor:
    """Falcon's (falcon-rw): BLOOM's slopes rounded to bfloat16, as its build_alibi_tensor
    rounds them whatever the model's dtype, and divided by sqrt(head_dim): Falcon scales the
    bias with the scores, (q.k + alibi) / sqrt(head_dim). [num_heads] float32 on the CPU.
    That code (RW's own too) also rounds each bias, slope x key position, to bfloat16, which no
    slope expresses: where the product is not exact (slopes no power of two, more than 8 heads)
    its biases differ from these by up to 2 ** -9 of themselves."""
    return bloom_alibi_slopes(num_heads).bfloat16().float() / math.sqrt(head_dim)


def mpt_alibi_slopes(num_heads: int, alibi_bias_max: float = 8) -> torch.Tensor:
    """MPT's slopes (transformers' build_mpt_alibi_tensor): for n, the power of two at or above
    num_heads, 2 ** -(alibi_bias_max * i / n) for i in 1..n; with fewer heads than n, the odd
    ones first, then the even ones, cut to num_heads. [num_heads] float32 on the CPU."""
    n = 2 ** math.ceil(math.log2(num_heads))
    base = torch.arange(1, n + 1, dtype=torch.int64, device="cpu").float() * (alibi_bias_max / n)
    slopes = 1.0 / torch.pow(2, base)
    if n != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes
