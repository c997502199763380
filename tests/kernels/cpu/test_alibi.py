"""ALiBi (BLOOM, MPT, falcon-rw): head h's score of the key at position p, for the query at
position q, gains alibi_slopes[h] * (p - q). The C decode and prefill kernels and the torch and
cpu backends against the reference, which adds the bias to each head's scores."""

import pytest
import torch

from pagedgen.attention import get_attention_backend
from pagedgen.attention.reference import ReferenceAttentionBackend, paged_attention_reference
from pagedgen.kernels.cpu import cpu_kernel_error, paged_attention_decode, paged_attention_prefill
from tests.attention.calls import forward
from tests.attention.test_backends import make_batch
from tests.kernels.cpu.test_paged_attention import MARCHES
from tests.kernels.cpu.test_prefill_attention import CONTEXT_LENS, QUERY_LENS, prefill_case
from tests.kernels.cpu.test_sliding_window import windowed_case

needs_kernel = pytest.mark.skipif(
    cpu_kernel_error() is not None, reason=f"no CPU kernel: {cpu_kernel_error()}"
)


def slopes_of(num_heads: int, seed: int) -> torch.Tensor:
    """Geometric slopes from 2^-8/num_heads to 2^-8 as BLOOM's, in a random head order: some
    heads see little but their last keys, some most of the context."""
    torch.manual_seed(seed)
    slopes = 2.0 ** (-8.0 * torch.arange(1, num_heads + 1) / num_heads)
    return slopes[torch.randperm(num_heads)].float().contiguous()


@needs_kernel
@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "head_dim,block_size,num_heads,num_kv_heads,window,softcap",
    [
        (64, 16, 16, 16, None, None),  # BLOOM-560m: head 64, every head its own K/V
        (128, 16, 8, 8, None, None),  # MPT-7B's head size
        (64, 8, 8, 2, 20, None),  # grouped heads and a window
        (40, 16, 6, 2, None, 5.0),  # the scalar path, after a soft cap
    ],
)
def test_decode_kernel_matches_reference(
    march, dtype, head_dim, block_size, num_heads, num_kv_heads, window, softcap
):
    query, key_cache, value_cache, tables, block_tables, context_lens = windowed_case(
        head_dim, block_size, num_heads, num_kv_heads, window, dtype, seed=head_dim + num_heads
    )
    slopes = slopes_of(num_heads, head_dim)
    scale = head_dim**-0.5
    out = torch.empty(query.shape)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    args = (key_cache, value_cache, block_tables, lens, scale, 2, march)
    paged_attention_decode(out, query, *args, window=window, softcap=softcap, alibi_slopes=slopes)
    reference = (query, key_cache.float(), value_cache.float(), tables, context_lens)
    options = ([1] * len(context_lens), scale, window, softcap)
    expected = paged_attention_reference(*reference, *options, alibi_slopes=slopes)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)
    without = paged_attention_reference(*reference, *options)
    assert (without - expected).abs().max() > 0.1  # the bias changed the result


@needs_kernel
@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "num_heads,num_kv_heads,window,softcap",
    [(12, 12, None, None), (8, 2, 37, None), (8, 2, None, 5.0)],
)
def test_prefill_kernel_matches_reference(march, dtype, num_heads, num_kv_heads, window, softcap):
    """Whole prompts and chunks after cached context: a row's bias counts from its own
    position in its sequence, not from its row in the step or its tile."""
    query, key_cache, value_cache, tables, block_tables, rows = prefill_case(
        64, num_heads, num_kv_heads, window, dtype, seed=num_heads
    )
    slopes = slopes_of(num_heads, num_heads)
    out = torch.full(query.shape, float("nan"))
    lens = torch.tensor(CONTEXT_LENS, dtype=torch.int32)
    args = (key_cache, value_cache, block_tables, *rows, lens, 0.125, 2, march)
    paged_attention_prefill(out, query, *args, window=window, softcap=softcap, alibi_slopes=slopes)
    reference = (query, key_cache.float(), value_cache.float(), tables, CONTEXT_LENS, QUERY_LENS)
    expected = paged_attention_reference(*reference, 0.125, window, softcap, alibi_slopes=slopes)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)


@needs_kernel
def test_kernels_reject_slopes_they_cannot_read():
    query = torch.randn(2, 4, 64)
    cache = torch.randn(4, 16, 2, 64)
    tables = torch.zeros(2, 1, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    args = (torch.empty(query.shape), query, cache, cache, tables, lens, 1.0)
    for slopes in (torch.ones(2), torch.ones(4, dtype=torch.float64), torch.ones(8)[::2]):
        with pytest.raises(ValueError, match="alibi_slopes"):
            paged_attention_decode(*args, alibi_slopes=slopes)


@pytest.mark.parametrize("backend_name", ["torch", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backends_with_alibi_match_reference(backend_name, dtype):
    """A mixed batch (decodes, prefills with and without cached context) through the backend a
    BLOOM layer calls, against the reference."""
    if backend_name == "cpu" and cpu_kernel_error() is not None:
        pytest.skip(f"no CPU kernel: {cpu_kernel_error()}")
    torch.manual_seed(2)
    num_heads, head_dim, block_size, num_blocks = 6, 64, 16, 64
    backend = get_attention_backend(backend_name, torch.device("cpu"), head_dim, block_size)
    query_lens, context_lens = [1, 1, 7, 16, 5], [1, 40, 7, 40, 33]
    md = make_batch(query_lens, context_lens, block_size, num_blocks, 0)
    num_tokens = sum(query_lens)
    query = torch.randn(num_tokens, num_heads, head_dim).to(dtype)
    key, value = (torch.randn(num_tokens, num_heads, head_dim).to(dtype) for _ in range(2))
    cache = torch.randn(2, num_blocks, block_size, num_heads, head_dim).to(dtype)
    ref_cache = cache.clone()
    slopes = slopes_of(num_heads, 3)
    backend.prepare(md)
    args = (md, head_dim**-0.5, None, None, None, slopes)
    out = forward(backend, query, key, value, cache[0], cache[1], *args)
    reference = ReferenceAttentionBackend()
    ref = forward(reference, query, key, value, ref_cache[0], ref_cache[1], *args)
    tolerance = 1e-5 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(out, ref, atol=tolerance, rtol=tolerance)
    ref_cache = cache.clone()
    plain = forward(reference, query, key, value, ref_cache[0], ref_cache[1], *args[:-1])
    assert (plain.float() - ref.float()).abs().max() > 0.1


def test_reference_bias_is_relative_to_the_query():
    """Shifting every score of a row by one constant leaves its softmax: a bias of slope * p
    (BLOOM's, absolute) and the reference's slope * (p - q) give the same attention. Checked by
    hand on one head: with q = k = 0 every score is the bias alone."""
    key_cache = torch.zeros(1, 8, 1, 4)
    value_cache = torch.arange(8.0).view(1, 8, 1, 1).expand(1, 8, 1, 4).contiguous()
    query = torch.zeros(1, 1, 4)
    slope = torch.tensor([0.5])
    out = paged_attention_reference(
        query, key_cache, value_cache, [[0]], [5], [1], 1.0, alibi_slopes=slope
    )
    weights = torch.softmax(0.5 * torch.arange(5.0), dim=0)
    torch.testing.assert_close(out[0, 0], (weights @ torch.arange(5.0)).expand(4))
