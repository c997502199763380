"""The C decode kernel with a sliding window and a soft cap against the reference: blocks before
a sequence's window are freed (block table entry -1, contents NaN) and must never be read."""

import pytest
import torch

from pagedgen.attention.reference import paged_attention_reference
from pagedgen.kernels.cpu import cpu_kernel_error, paged_attention_decode
from tests.kernels.cpu.test_paged_attention import MARCHES, scattered_tables

pytestmark = pytest.mark.skipif(
    cpu_kernel_error() is not None, reason=f"no CPU kernel: {cpu_kernel_error()}"
)


def windowed_case(head_dim, block_size, num_heads, num_kv_heads, window, dtype, seed):
    torch.manual_seed(seed)
    context_lens = [1, 15, 16, 17, 100, 257, 3, 40]
    num_blocks = sum(-(-n // block_size) for n in context_lens) + 8
    tables, block_tables = scattered_tables(context_lens, block_size, num_blocks, seed)
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    visible = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    for i, (table, n) in enumerate(zip(tables, context_lens)):
        first = max(0, n - window) if window else 0
        for p in range(first, n):
            visible[table[p // block_size] * block_size + p % block_size] = True
        for b in range(first // block_size):  # freed: the kernel must not follow the entry
            block_tables[i, b] = -1
    key_cache.view(-1, num_kv_heads, head_dim)[~visible] = float("nan")
    value_cache.view(-1, num_kv_heads, head_dim)[~visible] = float("nan")
    query = torch.randn(len(context_lens), num_heads, head_dim)
    if dtype == torch.bfloat16:  # a bfloat16 model's query, which AVX512_BF16 dot products take
        query = query.bfloat16().float()
    return query, key_cache, value_cache, tables, block_tables, context_lens


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "head_dim,block_size,num_heads,num_kv_heads,window,softcap",
    [
        (256, 16, 8, 4, 33, None),  # Gemma's head size, a window not a multiple of the block
        (256, 16, 4, 1, None, 50.0),  # Gemma 2's attention soft cap
        (64, 8, 4, 2, 16, 5.0),  # both, a window of whole blocks
        (40, 16, 2, 2, 7, 2.0),  # the scalar path
        (128, 32, 4, 4, 1, None),  # a window of one token: attention returns V of itself
    ],
)
def test_window_and_softcap_match_reference(
    march, dtype, head_dim, block_size, num_heads, num_kv_heads, window, softcap
):
    query, key_cache, value_cache, tables, block_tables, context_lens = windowed_case(
        head_dim, block_size, num_heads, num_kv_heads, window, dtype, seed=head_dim + block_size
    )
    scale = head_dim**-0.5
    out = torch.empty(query.shape)
    paged_attention_decode(
        out,
        query,
        key_cache,
        value_cache,
        block_tables,
        torch.tensor(context_lens, dtype=torch.int32),
        scale,
        num_threads=2,
        march=march,
        window=window,
        softcap=softcap,
    )
    expected = paged_attention_reference(
        query,
        key_cache.float(),
        value_cache.float(),
        tables,
        context_lens,
        [1] * len(context_lens),
        scale,
        window,
        softcap,
    )
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)
