"""The C decode attention kernel (kernels/paged_attention_cpu.c) against the reference; the cpu
backend on mixed decode/prefill batches is in tests/attention/test_backends.py."""

import platform
import random

import pytest
import torch

from pagedgen.attention.kv_cache_dtype import writable
from pagedgen.attention.reference import paged_attention_reference
from pagedgen.kernels.cpu import cpu_kernel_error, kernel_dtypes, paged_attention_decode
from pagedgen.kernels.cpu_features import cpu_flags

pytestmark = pytest.mark.skipif(
    cpu_kernel_error() is not None, reason=f"no CPU kernel: {cpu_kernel_error()}"
)

# Every build a machine of ours may run: its own, AVX2 (x86-64-v3, what an AVX-512 machine runs
# under PAGEDGEN_MAX_CPU_ISA=avx2) and the x86-64 baseline (SSE2), so both ISAs' code paths are
# tested whichever machine the tests run on.
MARCHES = ["native"]
if platform.machine() in ("x86_64", "AMD64"):
    MARCHES += ["x86-64-v3"] * ("avx2" in cpu_flags()) + ["x86-64"]


FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def scattered_tables(context_lens, block_size, num_blocks, seed):
    rng = random.Random(seed)
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in context_lens]
    width = max(len(t) for t in tables) + 2  # wider than needed, as the runner's tables are
    return tables, torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)


def check_against_reference(
    head_dim, block_size, num_heads, num_kv_heads, num_threads, dtype=torch.float32, march=None
):
    seed = head_dim + block_size + num_heads + num_threads
    torch.manual_seed(seed)
    context_lens = [1, 15, 16, 17, 100, 257, 3]
    num_blocks = sum(-(-n // block_size) for n in context_lens) + 8
    tables, block_tables = scattered_tables(context_lens, block_size, num_blocks, seed)
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    # every slot no sequence owns holds NaN (E4M3's NaN code, which the kernel's vector loads
    # read as 480): reading past a context poisons the output
    owned = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    for table, n in zip(tables, context_lens):
        for p in range(n):
            owned[table[p // block_size] * block_size + p % block_size] = True
    nan = torch.tensor(float("nan")).to(dtype)
    for cache in (key_cache, value_cache):
        writable(cache).view(-1, num_kv_heads, head_dim)[~owned] = writable(nan)
    # query rows inside a wider fused projection, as the model hands them over
    fused = torch.randn(len(context_lens), (num_heads + 2 * num_kv_heads) * head_dim)
    if dtype == torch.bfloat16:  # a bfloat16 model's query, which AVX512_BF16 dot products take
        fused = fused.bfloat16().float()
    query = fused[:, : num_heads * head_dim].view(-1, num_heads, head_dim)
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
        num_threads,
        march,
    )
    ref = paged_attention_reference(  # the kernel widens the cache exactly: compare in float32
        query,
        key_cache.float(),
        value_cache.float(),
        tables,
        context_lens,
        [1] * len(context_lens),
        scale,
    )
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [64, 128, 80, 32])  # 80, 32: the generic path
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3), (8, 1)])
@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_matches_reference(head_dim, block_size, num_heads, num_kv_heads, num_threads):
    check_against_reference(head_dim, block_size, num_heads, num_kv_heads, num_threads)


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_heads", [16, 128])  # DeepSeek-V2-Lite's, V3's: the largest group
def test_mla_latent_shape(march, dtype, num_heads):
    """MLA's cache: one latent of 576 (kv_lora_rank 512 + rope 64) that all heads attend to."""
    check_against_reference(576, 16, num_heads, 1, 2, dtype, march)


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, *FP8])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256, 80, 32])  # every unit the kernel has
@pytest.mark.parametrize("num_heads,num_kv_heads", [(9, 3), (8, 1)])
def test_every_build_reads_every_cache_dtype(march, dtype, head_dim, num_heads, num_kv_heads):
    if dtype not in kernel_dtypes(march):
        pytest.skip(f"this compiler has no _Float16 for the {march} build")
    check_against_reference(head_dim, 16, num_heads, num_kv_heads, 2, dtype, march)


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("head_dim", [64, 80, 32])  # 80, 32: the widening and scalar paths
def test_bfloat16_query_and_output_are_the_float32_result_rounded(march, head_dim):
    """A bfloat16 model hands its query over as it is and takes bfloat16 rows back: the kernel
    widens the query exactly and rounds its float32 output once."""
    torch.manual_seed(head_dim)
    num_heads, num_kv_heads, block_size = 9, 3, 16
    context_lens = [1, 40, 257]
    num_blocks = sum(-(-n // block_size) for n in context_lens) + 4
    _, block_tables = scattered_tables(context_lens, block_size, num_blocks, head_dim)
    key_cache, value_cache = (
        torch.randn(num_blocks, block_size, num_kv_heads, head_dim).bfloat16() for _ in range(2)
    )
    query = torch.randn(len(context_lens), num_heads, head_dim).bfloat16()
    lens = torch.tensor(context_lens, dtype=torch.int32)
    args = (key_cache, value_cache, block_tables, lens, head_dim**-0.5, 2, march)
    wide = paged_attention_decode(torch.empty(query.shape), query.float(), *args)
    out = paged_attention_decode(torch.empty_like(query), query, *args)
    assert out.dtype == torch.bfloat16 and torch.equal(out, wide.bfloat16())
    with pytest.raises(TypeError, match="both bfloat16"):
        paged_attention_decode(torch.empty(query.shape), query, *args)


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 128, 80])
@pytest.mark.parametrize("options", ["plain", "window", "softcap_sinks_alibi"])
def test_each_kv_head_alone_gives_the_same_bits(march, dtype, head_dim, options):
    """Several kv heads of small groups take the sequence-major pass, one kv head alone the unit
    pass: both sum each query head's scores, softmax and V rows in the same order, so every
    output bit agrees, whatever the heads beside it and however the threads split the work."""
    torch.manual_seed(head_dim)
    num_heads, num_kv_heads, block_size = 32, 8, 16
    group = num_heads // num_kv_heads
    context_lens = [125, 1, 17, 300, 64, 125]
    num_blocks = sum(-(-n // block_size) for n in context_lens) + 4
    _, block_tables = scattered_tables(context_lens, block_size, num_blocks, head_dim)
    key_cache, value_cache = (
        torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype) for _ in range(2)
    )
    query = torch.randn(len(context_lens), num_heads, head_dim).to(dtype)
    lens = torch.tensor(context_lens, dtype=torch.int32)
    kwargs = {}
    if options == "window":
        kwargs = {"window": 40}
    elif options == "softcap_sinks_alibi":
        kwargs = {
            "softcap": 5.0,
            "sinks": torch.randn(num_heads),
            "alibi_slopes": torch.rand(num_heads),
        }
    args = (block_tables, lens, head_dim**-0.5)
    out = paged_attention_decode(
        torch.empty_like(query), query, key_cache, value_cache, *args, 3, march, **kwargs
    )
    for h in range(num_kv_heads):
        heads = slice(h * group, (h + 1) * group)
        alone = {k: v[heads] if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        k, v = (c[:, :, h : h + 1].contiguous() for c in (key_cache, value_cache))
        q = query[:, heads].contiguous()
        ref = paged_attention_decode(torch.empty_like(q), q, k, v, *args, 1, march, **alone)
        assert torch.equal(out[:, heads], ref), f"kv head {h}"


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("head_dim", [256, 64, 80, 32])  # 16-, 8- and 4-wide loads; scalar ones
def test_every_fp8_code_widens_exactly(march, dtype, head_dim):
    """A context of one token returns its V row: each finite code of the 8-bit type, read by
    every load the kernel has, comes out as torch widens it."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    codes = codes[codes.view(dtype).float().isfinite()].repeat(3)
    codes = codes[: len(codes) // head_dim * head_dim]
    num_seqs = len(codes) // head_dim
    value_cache = codes.view(num_seqs, 1, 1, head_dim).view(dtype)
    key_cache = torch.zeros_like(value_cache)
    query = torch.randn(num_seqs, 2, head_dim)
    tables = torch.arange(num_seqs, dtype=torch.int32).view(num_seqs, 1)
    lens = torch.ones(num_seqs, dtype=torch.int32)
    args = (key_cache, value_cache, tables, lens, 1.0, 2, march)
    out = paged_attention_decode(torch.empty(query.shape), query, *args)
    assert torch.equal(out, value_cache.float().view(num_seqs, 1, head_dim).expand_as(out))


def test_rejects_what_it_cannot_read():
    query = torch.randn(2, 4, 64)
    cache = torch.randn(4, 16, 2, 64)
    tables = torch.zeros(2, 1, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    out = torch.empty(query.shape)
    with pytest.raises(TypeError, match="float32"):
        paged_attention_decode(out, query.double(), cache, cache, tables, lens, 1.0)
    with pytest.raises(TypeError, match="this build reads"):
        paged_attention_decode(out, query, cache.double(), cache.double(), tables, lens, 1.0)
    with pytest.raises(TypeError, match="int32"):
        paged_attention_decode(out, query, cache, cache, tables.long(), lens, 1.0)
    with pytest.raises(ValueError, match="contiguous"):
        paged_attention_decode(
            out, query.transpose(1, 2).contiguous().transpose(1, 2), cache, cache, tables, lens, 1.0
        )
    with pytest.raises(ValueError, match="does not match"):
        paged_attention_decode(out, query, cache[..., :32], cache[..., :32], tables, lens, 1.0)


def test_auto_picks_the_cpu_kernel_on_the_cpu():
    from pagedgen.attention import get_attention_backend

    assert get_attention_backend("auto", torch.device("cpu"), 64, 16).name == "cpu"


def test_each_cache_dtype_has_its_own_build_that_refuses_the_others():
    """One build a cache dtype (a build of all five took ~50 s at -O3): each computes its own
    dtype, as the tests above check, and refuses another rather than reading it as its own."""
    from pagedgen.kernels.cpu import KV_DTYPE_CODES, _leading_args, _library, _trailing_args

    query = torch.randn(1, 2, 64)
    out = torch.empty_like(query)
    cache = torch.randn(4, 16, 2, 64).bfloat16()
    tables, lens = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    head = _leading_args(out, query, cache, cache, tables)
    assert head[0] == KV_DTYPE_CODES[torch.bfloat16]
    float32_build = _library("native", KV_DTYPE_CODES[torch.float32])
    tail = _trailing_args(query, cache, 0.125, None, None, None, None, 1)
    assert float32_build.paged_attention_decode(*head, lens.data_ptr(), 1, *tail) == 1
    bfloat16_build = _library("native", KV_DTYPE_CODES[torch.bfloat16])
    assert bfloat16_build.paged_attention_decode(*head, lens.data_ptr(), 1, *tail) == 0
    assert float32_build is not bfloat16_build
