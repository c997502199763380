"""Attention sinks (gpt-oss): one learned logit per query head joins its softmax as a key whose
value is zero. The C decode kernel and the torch and cpu backends against the reference, which
appends the sink to each head's scores."""

import pytest
import torch

from pagedgen.attention import get_attention_backend
from pagedgen.attention.reference import ReferenceAttentionBackend, paged_attention_reference
from pagedgen.kernels.cpu import cpu_kernel_error, paged_attention_decode
from tests.attention.calls import forward
from tests.attention.test_backends import make_batch
from tests.kernels.cpu.test_paged_attention import MARCHES
from tests.kernels.cpu.test_sliding_window import windowed_case

needs_kernel = pytest.mark.skipif(
    cpu_kernel_error() is not None, reason=f"no CPU kernel: {cpu_kernel_error()}"
)


def sinks_of(num_heads: int, seed: int) -> torch.Tensor:
    """Per head, logits from well below to well above a score's range: some heads' sinks take
    most of the weight, some next to none."""
    torch.manual_seed(seed)
    return torch.linspace(-6.0, 6.0, num_heads)[torch.randperm(num_heads)]


@needs_kernel
@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "head_dim,block_size,num_heads,num_kv_heads,window",
    [
        (64, 16, 16, 2, 20),  # gpt-oss: head 64, GQA 8:1, its sliding layers
        (64, 16, 16, 2, None),  # and its full ones
        (128, 8, 4, 4, None),  # no GQA
        (40, 16, 6, 2, 7),  # the scalar path
    ],
)
def test_kernel_sinks_match_reference(
    march, dtype, head_dim, block_size, num_heads, num_kv_heads, window
):
    query, key_cache, value_cache, tables, block_tables, context_lens = windowed_case(
        head_dim, block_size, num_heads, num_kv_heads, window, dtype, seed=head_dim + num_heads
    )
    sinks = sinks_of(num_heads, head_dim)
    scale = head_dim**-0.5
    out = torch.empty(query.shape)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    args = (key_cache, value_cache, block_tables, lens, scale)
    paged_attention_decode(out, query, *args, 2, march, window=window, sinks=sinks)
    reference = (query, key_cache.float(), value_cache.float(), tables, context_lens)
    expected = paged_attention_reference(
        *reference, [1] * len(context_lens), scale, window, sinks=sinks
    )
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)
    without = paged_attention_reference(*reference, [1] * len(context_lens), scale, window)
    assert (without - expected).abs().max() > 0.1  # the sinks changed the result


def test_a_dominant_sink_takes_all_the_weight():
    """A sink far above every score leaves the heads next to nothing; one far below, the plain
    softmax: the yardstick itself."""
    torch.manual_seed(0)
    query, key_cache, value_cache, tables, _, context_lens = windowed_case(
        32, 16, 4, 2, None, torch.float32, seed=0
    )
    args = (query, key_cache, value_cache, tables, context_lens, [1] * len(context_lens), 0.2)
    high = paged_attention_reference(*args, sinks=torch.full((4,), 80.0))
    low = paged_attention_reference(*args, sinks=torch.full((4,), -80.0))
    assert high.abs().max() < 1e-20
    torch.testing.assert_close(low, paged_attention_reference(*args))


@needs_kernel
def test_kernel_rejects_sinks_it_cannot_read():
    query = torch.randn(2, 4, 64)
    cache = torch.randn(4, 16, 2, 64)
    tables = torch.zeros(2, 1, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    args = (torch.empty(query.shape), query, cache, cache, tables, lens, 1.0)
    for sinks in (torch.zeros(2), torch.zeros(4, dtype=torch.float64), torch.zeros(8)[::2]):
        with pytest.raises(ValueError, match="sinks"):
            paged_attention_decode(*args, sinks=sinks)


@pytest.mark.parametrize("backend_name", ["torch", "cpu"])
@pytest.mark.parametrize("window", [None, 9])
def test_backends_with_sinks_match_reference(backend_name, window):
    """A mixed batch (decodes, prefills with and without cached context) through the backend a
    gpt-oss layer calls, against the reference."""
    if backend_name == "cpu" and cpu_kernel_error() is not None:
        pytest.skip(f"no CPU kernel: {cpu_kernel_error()}")
    torch.manual_seed(1)
    num_heads, num_kv_heads, head_dim, block_size, num_blocks = 8, 2, 64, 16, 64
    backend = get_attention_backend(backend_name, torch.device("cpu"), head_dim, block_size)
    query_lens, context_lens = [1, 1, 7, 16, 5], [1, 40, 7, 40, 33]
    md = make_batch(query_lens, context_lens, block_size, num_blocks, 0)
    num_tokens = sum(query_lens)
    query = torch.randn(num_tokens, num_heads, head_dim)
    key, value = (torch.randn(num_tokens, num_kv_heads, head_dim) for _ in range(2))
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim)
    ref_cache = cache.clone()
    sinks = sinks_of(num_heads, 1)
    backend.prepare(md)
    args = (md, head_dim**-0.5, window, None, sinks)
    out = forward(backend, query, key, value, cache[0], cache[1], *args)
    reference = ReferenceAttentionBackend()
    ref = forward(reference, query, key, value, ref_cache[0], ref_cache[1], *args)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    ref_cache = cache.clone()
    plain = forward(reference, query, key, value, ref_cache[0], ref_cache[1], *args[:-1])
    assert (plain - ref).abs().max() > 0.1
