"""Random prefill and chunked-prefill batches over a scattered, NaN-poisoned paged cache, and the
check against the torch reference; shared by the emulation, mutation and GPU tests."""

from collections.abc import Callable
from typing import NamedTuple

import torch

from pagedgen.attention.kv_cache_dtype import to_cache_dtype
from pagedgen.attention.reference import paged_attention_reference
from pagedgen.kernels.launch import KernelLaunch
from pagedgen.kernels.prefill_attention import prefill_attention_launch
from tests.kernels.paged_cases import TOLERANCES, bloom_alibi_slopes, dequantized

# (query_len, context_len): a whole prompt of one token, of a tile minus one, of several tiles
# ending in a partial block, and chunks after a cached prefix (one of a single token).
SEQS = ((1, 1), (15, 15), (37, 37), (20, 53), (1, 30), (9, 100))


class PrefillCase(NamedTuple):
    query: torch.Tensor  # [num_tokens, num_heads, head_size]
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks_per_seq] int32, padded with 0
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32
    context_lens: torch.Tensor  # [num_seqs] int32
    block_table_lists: list[list[int]]
    query_lens: list[int]
    scale: float
    window: int | None
    softcap: float | None
    sinks: torch.Tensor | None = None  # [num_heads] float32
    alibi_slopes: torch.Tensor | None = None  # [num_heads] float32


def make_prefill_case(
    dtype: torch.dtype,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    seqs: tuple[tuple[int, int], ...] = SEQS,
    window: int | None = None,
    softcap: float | None = None,
    seed: int = 0,
    device: str = "cpu",
    cache_dtype: torch.dtype | None = None,  # None: dtype
    sinks: bool = False,  # gpt-oss's: one logit per head, from well below to well above a score
    alibi: bool = False,  # BLOOM's slopes, shuffled over the heads
) -> PrefillCase:
    """Each sequence gets randomly chosen blocks; every slot it does not own stays NaN.

    Block 0 is never handed out, the block tables are padded with 0, and with a window the
    entries of blocks wholly before the first query's window point at block 0 too (the engine
    frees them): a kernel reading a token it must not reads NaN and the result shows it. The
    cache is filled in float32, then rounded to cache_dtype as the backends write it.
    """
    g = torch.Generator().manual_seed(seed)
    query_lens = [q for q, _ in seqs]
    context_lens = [c for _, c in seqs]
    assert all(0 < q <= c for q, c in seqs), seqs
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + 4
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.full(shape, float("nan"))
    value_cache = torch.full(shape, float("nan"))
    free_blocks = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    tables, kernel_tables = [], []
    for query_len, context_len, num_seq_blocks in zip(query_lens, context_lens, blocks_per_seq):
        table = [free_blocks.pop() for _ in range(num_seq_blocks)]
        tables.append(table)
        first = 0 if window is None else max(0, context_len - query_len - window + 1)
        kernel_tables.append([0] * (first // block_size) + table[first // block_size :])
        positions = torch.arange(context_len)
        slots = torch.tensor(table)[positions // block_size] * block_size
        slots += positions % block_size
        for cache in (key_cache, value_cache):
            values = torch.randn(context_len, num_kv_heads, head_size, generator=g)
            values[: first // block_size * block_size] = float("nan")
            cache.view(-1, num_kv_heads, head_size)[slots] = values
    key_cache, value_cache = (
        to_cache_dtype(c, cache_dtype or dtype) for c in (key_cache, value_cache)
    )
    max_blocks = max(blocks_per_seq)
    block_tables = torch.tensor(
        [table + [0] * (max_blocks - len(table)) for table in kernel_tables], dtype=torch.int32
    )
    cu_seqlens_q = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()])
    # Doubled queries make the softmax peakier, so a missed rescale cannot hide in the noise.
    query = 2 * torch.randn(sum(query_lens), num_heads, head_size, generator=g)
    return PrefillCase(
        query.to(dtype).to(device),
        key_cache.to(device),
        value_cache.to(device),
        block_tables.to(device),
        cu_seqlens_q.to(torch.int32).to(device),
        torch.tensor(context_lens, dtype=torch.int32, device=device),
        tables,
        query_lens,
        head_size**-0.5,
        window,
        softcap,
        torch.linspace(-6.0, 6.0, num_heads, device=device) if sinks else None,
        bloom_alibi_slopes(num_heads, seed).to(device) if alibi else None,
    )


def prefill_reference(case: PrefillCase) -> torch.Tensor:
    return paged_attention_reference(
        case.query.cpu(),
        dequantized(case.key_cache),
        dequantized(case.value_cache),
        case.block_table_lists,
        case.context_lens.tolist(),
        case.query_lens,
        case.scale,
        case.window,
        case.softcap,
        None if case.sinks is None else case.sinks.cpu(),
        None if case.alibi_slopes is None else case.alibi_slopes.cpu(),
    )


def run_prefill(
    launch: Callable[[KernelLaunch], None],
    case: PrefillCase,
    query: torch.Tensor | None = None,
    tensor_cores: bool = False,
) -> torch.Tensor:
    query = case.query if query is None else query
    out = torch.full_like(case.query, float("nan"))
    kernel_launch = prefill_attention_launch(
        out,
        query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.cu_seqlens_q,
        case.context_lens,
        max(case.query_lens),
        case.scale,
        case.window,
        case.softcap,
        case.sinks,
        case.alibi_slopes,
        tensor_cores,
    )
    assert kernel_launch is not None
    launch(kernel_launch)
    return out


def check_prefill(
    launch: Callable[[KernelLaunch], None], case: PrefillCase, tensor_cores: bool = False
) -> None:
    """Runs the kernel through launch and asserts it matches the reference (NaN never does)."""
    out = run_prefill(launch, case, tensor_cores=tensor_cores)
    tolerance = TOLERANCES[case.query.dtype]
    torch.testing.assert_close(
        out.cpu().float(), prefill_reference(case).float(), atol=tolerance, rtol=tolerance
    )
