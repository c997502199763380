import random

import pytest
import torch

from pagedgen.attention import get_attention_backend
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.reference import ReferenceAttentionBackend
from pagedgen.kernels.cpu import cpu_kernel_error
from tests.attention.calls import forward


def make_batch(query_lens, context_lens, block_size, num_blocks, seed):
    """Scattered block tables: every sequence gets random distinct physical blocks."""
    rng = random.Random(seed)
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables, slots = [], []
    for query_len, context_len in zip(query_lens, context_lens):
        table = [free.pop() for _ in range(-(-context_len // block_size))]
        tables.append(table)
        for p in range(context_len - query_len, context_len):
            slots.append(table[p // block_size] * block_size + p % block_size)
    width = max(len(t) for t in tables)
    cu = [0]
    for q in query_lens:
        cu.append(cu[-1] + q)
    num_decode = next((i for i, q in enumerate(query_lens) if q != 1), len(query_lens))
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
        context_lens=torch.tensor(context_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        max_seqlen_q=max(query_lens),
        max_context_len=max(context_lens),
        block_size=block_size,
        num_decode_seqs=num_decode,
        query_lens_cpu=list(query_lens),
        context_lens_cpu=list(context_lens),
    )


def forward_against_reference(
    backend_name, query_lens, context_lens, block_size, num_blocks, heads, batch_seed
):
    """One float32 forward of the backend and one of the reference over the same random batch
    (torch's generator seeded by the caller): out, ref, and the caches each wrote."""
    num_heads, num_kv_heads, head_dim = heads
    backend = get_attention_backend(backend_name, torch.device("cpu"), head_dim, block_size)
    md = make_batch(query_lens, context_lens, block_size, num_blocks, batch_seed)
    num_tokens = sum(query_lens)
    query = torch.randn(num_tokens, num_heads, head_dim)
    key = torch.randn(num_tokens, num_kv_heads, head_dim)
    value = torch.randn(num_tokens, num_kv_heads, head_dim)
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim)
    ref_cache = cache.clone()
    scale = head_dim**-0.5
    backend.prepare(md)
    out = forward(backend, query, key, value, cache[0], cache[1], md, scale)
    ref = forward(
        ReferenceAttentionBackend(), query, key, value, ref_cache[0], ref_cache[1], md, scale
    )
    return out, ref, cache, ref_cache


@pytest.mark.parametrize("backend_name", ["torch", "cpu"])
@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("seed", [0, 1])
def test_backend_matches_reference(
    backend_name, head_dim, block_size, num_heads, num_kv_heads, seed
):
    if backend_name == "cpu" and cpu_kernel_error() is not None:
        pytest.skip(f"no CPU kernel: {cpu_kernel_error()}")
    torch.manual_seed(seed)
    # decodes (1 query row) first, then prefills with and without cached context
    query_lens = [1, 1, 1, 7, 16, 5, 1]
    context_lens = [1, 17, 100, 7, 40, 33, 1]
    heads = (num_heads, num_kv_heads, head_dim)
    out, ref, cache, ref_cache = forward_against_reference(
        backend_name, query_lens, context_lens, block_size, 128, heads, seed
    )
    assert torch.equal(cache, ref_cache)  # K/V land in exactly the same slots
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend_name", ["torch", "cpu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_backends_match_reference(backend_name, dtype):
    """Half-precision caches on the CPU: the C kernel widens K/V, SDPA computes float16 in
    float32; both agree with the float32 reference on the same (rounded) inputs."""
    if backend_name == "cpu" and cpu_kernel_error() is not None:
        pytest.skip(f"no CPU kernel: {cpu_kernel_error()}")
    torch.manual_seed(0)
    num_blocks, block_size, num_heads, num_kv_heads, head_dim = 64, 16, 6, 2, 64
    backend = get_attention_backend(backend_name, torch.device("cpu"), head_dim, block_size)
    query_lens = [1, 1, 1, 7, 16, 5]
    context_lens = [1, 17, 100, 7, 40, 33]
    md = make_batch(query_lens, context_lens, block_size, num_blocks, 0)
    num_tokens = sum(query_lens)
    query = torch.randn(num_tokens, num_heads, head_dim).to(dtype)
    key = torch.randn(num_tokens, num_kv_heads, head_dim).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim).to(dtype)
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    ref_cache = cache.float()
    backend.prepare(md)
    out = forward(backend, query, key, value, cache[0], cache[1], md, head_dim**-0.5)
    ref = forward(
        ReferenceAttentionBackend(),
        query.float(),
        key.float(),
        value.float(),
        ref_cache[0],
        ref_cache[1],
        md,
        head_dim**-0.5,
    )
    assert out.dtype == dtype
    assert torch.equal(cache.float(), ref_cache)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("backend_name", ["torch", "cpu"])
@pytest.mark.parametrize("kv_cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_caches_match_the_reference_over_the_rounded_kv(backend_name, kv_cache_dtype, dtype):
    """An fp8 cache under float32 or bfloat16 activations: every backend writes the same bytes
    (saturated, rounded to nearest even) and attends over K/V as the cache holds them, this
    step's prefill tokens included, as the reference does reading everything from the cache."""
    if backend_name == "cpu" and cpu_kernel_error() is not None:
        pytest.skip(f"no CPU kernel: {cpu_kernel_error()}")
    torch.manual_seed(1)
    num_blocks, block_size, num_heads, num_kv_heads, head_dim = 64, 16, 6, 2, 64
    backend = get_attention_backend(backend_name, torch.device("cpu"), head_dim, block_size)
    query_lens = [1, 1, 1, 7, 16, 5]
    context_lens = [1, 17, 100, 7, 40, 33]  # prefills with and without cached context
    md = make_batch(query_lens, context_lens, block_size, num_blocks, 0)
    num_tokens = sum(query_lens)
    query = torch.randn(num_tokens, num_heads, head_dim).to(dtype)
    key = (torch.randn(num_tokens, num_kv_heads, head_dim) * 4).to(dtype)
    key[0, 0, :2] = 1e6  # saturates, where a plain cast to E5M2 would store inf
    value = torch.randn(num_tokens, num_kv_heads, head_dim).to(dtype)
    cache = (torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim) * 4).to(kv_cache_dtype)
    ref_cache = cache.clone()
    backend.prepare(md)
    out = forward(backend, query, key, value, cache[0], cache[1], md, head_dim**-0.5)
    reference = ReferenceAttentionBackend()
    ref = forward(reference, query, key, value, ref_cache[0], ref_cache[1], md, head_dim**-0.5)
    assert torch.equal(cache.view(torch.uint8), ref_cache.view(torch.uint8))
    assert cache[0].float().isfinite().all()
    assert out.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, ref, atol=tolerance, rtol=tolerance)


@pytest.mark.skipif(cpu_kernel_error() is not None, reason="no CPU kernel")
def test_cpu_backend_prefills_long_sequences_too():
    """A 1,500-token prompt and a chunk after 1,000 cached tokens beside decodes: many tiles
    of the prefill kernel, its K/V gathered once per (sequence, kv head) and extended."""
    torch.manual_seed(0)
    query_lens, context_lens = [1, 1500, 9, 300], [30, 1500, 20, 1300]
    out, ref, _, _ = forward_against_reference(
        "cpu", query_lens, context_lens, 16, 200, (4, 2, 32), 0
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_reference_attends_only_to_visible_positions():
    """A sanity check of the yardstick: a lone query sees only itself, so it returns its V."""
    md = make_batch([1], [1], 4, 4, 0)
    key_cache = torch.zeros(4, 4, 1, 8)
    value_cache = torch.zeros(4, 4, 1, 8)
    value = torch.arange(8.0).view(1, 1, 8)
    out = forward(
        ReferenceAttentionBackend(),
        torch.randn(1, 1, 8),
        torch.randn(1, 1, 8),
        value,
        key_cache,
        value_cache,
        md,
        1.0,
    )
    assert torch.equal(out, value)


@pytest.mark.parametrize("sinks", [None, torch.linspace(-3.0, 3.0, 8)])
def test_batched_and_per_sequence_decode_agree(sinks):
    """The GPU's padded batch path and the CPU's per-sequence path compute the same thing (with
    sinks, gpt-oss's layers on a GPU: the padding is masked before the sink joins the softmax)."""
    from pagedgen.attention.torch_backend import (
        decode_attention,
        decode_attention_per_seq,
        split_block_tables,
    )

    torch.manual_seed(0)
    context_lens = [1, 15, 16, 17, 100, 257]
    md = make_batch([1] * len(context_lens), context_lens, 16, 64, 0)
    query = torch.randn(len(context_lens), 8, 32)
    cache = torch.randn(2, 64, 16, 2, 32)
    tables = (md.block_tables, md.context_lens, 257)
    batched = decode_attention(query, cache[0], cache[1], *tables, 0.2, sinks=sinks)
    seq_blocks = split_block_tables(md.block_tables, context_lens, 16)
    per_seq = decode_attention_per_seq(
        query, cache[0], cache[1], seq_blocks, context_lens, 0.2, sinks=sinks
    )
    torch.testing.assert_close(batched, per_seq, atol=1e-5, rtol=1e-5)


def test_auto_falls_back_to_torch_without_the_cpu_kernel(monkeypatch):
    monkeypatch.setattr("pagedgen.attention.selector.cpu_kernel_error", lambda: "no C compiler")
    monkeypatch.setattr("pagedgen.attention.cpu_backend.cpu_kernel_error", lambda: "no C compiler")
    cpu = torch.device("cpu")
    assert get_attention_backend("auto", cpu, 64, 16).name == "torch"
    with pytest.raises(RuntimeError, match="no C compiler"):
        get_attention_backend("cpu", cpu, 64, 16)


def test_a_failed_compile_says_why(monkeypatch, tmp_path):
    from pagedgen.kernels import cpu_build

    monkeypatch.setenv("PAGEDGEN_CACHE", str(tmp_path))
    with pytest.raises(cpu_build.CpuKernelUnavailable, match="failed on paged_attention_cpu.c"):
        cpu_build.compile_source("false", "paged_attention_cpu.c", "int x;", cpu_build.CFLAGS)
    assert not list(tmp_path.rglob("*.so"))


@pytest.mark.skipif(cpu_kernel_error() is not None, reason="no CPU kernel")
def test_cpu_backend_attends_rows_past_a_prompt_as_decode_rows():
    """A prompt chunk, drafts after a prompt (every row sampled), a recompute (prompt and output
    in one chunk): prompt rows take the tiled kernel, the others the decode kernel, each the bits
    a decode step of that row gives; all match the reference."""
    from pagedgen.attention.cpu_backend import prefill_plan
    from pagedgen.kernels.cpu import paged_attention_decode

    torch.manual_seed(0)
    query_lens, context_lens, prompt_lens = [1, 20, 4, 30], [9, 40, 50, 30], [5, 60, 46, 12]
    md = make_batch(query_lens, context_lens, 16, 40, 0)
    md.prompt_lens_cpu = prompt_lens
    plan = prefill_plan(md)
    assert plan.prompt[2].tolist() == [20, 12]  # the chunk's rows, the recompute's first 12
    rows, _, lens = plan.sampled
    assert rows.tolist() == [*range(20, 24), *range(36, 54)]
    assert lens.tolist() == [*range(47, 51), *range(13, 31)]
    backend = get_attention_backend("cpu", torch.device("cpu"), 32, 16)
    num_tokens = sum(query_lens)
    query = torch.randn(num_tokens, 4, 32)
    key, value = (torch.randn(num_tokens, 2, 32) for _ in range(2))
    cache = torch.randn(2, 40, 16, 2, 32)
    ref_cache = cache.clone()
    backend.prepare(md)
    out = forward(backend, query, key, value, cache[0], cache[1], md, 0.2)
    ref = forward(
        ReferenceAttentionBackend(), query, key, value, ref_cache[0], ref_cache[1], md, 0.2
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    sampled = 1 + rows  # after the decode row
    tables = md.block_tables[[2] * 4 + [3] * 18]
    alone = torch.empty(len(rows), 4, 32)
    paged_attention_decode(alone, query[sampled], cache[0], cache[1], tables, lens, 0.2)
    assert torch.equal(out[sampled], alone)
