"""fp8 KV caches in the CuPy kernels on a real GPU: the emulation tests' exact conversion checks
and attention checks, block copies and swaps, the backend against the reference backend, and the
engine's greedy output against the torch backend's over the same fp8 cache. Skipped without a
CUDA GPU and CuPy."""

import pytest
import torch

from pagedgen.attention.kv_cache_dtype import to_cache_dtype
from pagedgen.attention.reference import ReferenceAttentionBackend
from pagedgen.kernels import loader
from pagedgen.kernels.attention_args import BLOCK_SIZES, HEAD_SIZES
from pagedgen.kernels.cache_ops import copy_blocks, swap_blocks
from tests.attention.calls import forward
from tests.kernels.fp8_cases import READ_KERNELS, check_reads, check_writes
from tests.kernels.gpu.test_cupy_backend import greedy_token_ids, prompts
from tests.kernels.paged_cases import (
    DTYPES,
    FP8_DTYPES,
    TOLERANCES,
    check_decode,
    make_decode_case,
    make_metadata,
)
from tests.kernels.prefill_cases import check_prefill, make_prefill_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and loader.cupy_available()),
        reason="needs a CUDA GPU and CuPy (pip install 'pagedgen[cuda]')",
    ),
]


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_writes_match_to_cache_dtype(dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    check_writes(loader.launch, dtype, cache_dtype, "cuda")


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", READ_KERNELS)
def test_reads_are_exact(kernel: str, dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    check_reads(loader.launch, kernel, dtype, cache_dtype, "cuda")


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("head_size", HEAD_SIZES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_attention(dtype, cache_dtype, block_size: int, head_size: int, version: int):
    case = make_decode_case(
        dtype, 8, 2, head_size, block_size, device="cuda", cache_dtype=cache_dtype
    )
    check_decode(loader.launch, case, version)
    check_decode(loader.launch, case, version, partition_size=64, grouped=True)


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_attention_long_contexts(dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    """Real 512-token partitions, and the grouped kernel's planner, over thousands of tokens."""
    case = make_decode_case(
        dtype, 8, 1, 128, 16, context_lens=(600, 1500, 4097), device="cuda", cache_dtype=cache_dtype
    )
    for version in (1, 2):
        check_decode(loader.launch, case, version)
    for version in (None, 1, 2):
        check_decode(loader.launch, case, version, grouped=True)


@pytest.mark.parametrize("head_size", HEAD_SIZES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_attention(dtype, cache_dtype, block_size: int, head_size: int) -> None:
    case = make_prefill_case(
        dtype, 8, 2, head_size, block_size, device="cuda", cache_dtype=cache_dtype
    )
    check_prefill(loader.launch, case)


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
def test_prefill_long_prompts_window_softcap(cache_dtype: torch.dtype) -> None:
    seqs = ((2048, 2048), (1000, 4097), (3, 3000), (517, 517))
    case = make_prefill_case(
        torch.bfloat16, 32, 8, 128, 16, seqs, window=300, softcap=30.0, device="cuda",
        cache_dtype=cache_dtype,
    )  # fmt: skip
    check_prefill(loader.launch, case)


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
def test_copy_and_swap_blocks(cache_dtype: torch.dtype) -> None:
    def random_cache(*shape: int, device: str = "cuda") -> torch.Tensor:
        codes = torch.randint(0, 256, shape, dtype=torch.uint8)
        return codes.view(cache_dtype).to(device)

    kv_caches = [random_cache(2, 12, 16, 2, 64) for _ in range(3)]
    src_to_dst = [(0, 5), (0, 6), (3, 11)]
    expected = [kv_cache.cpu().view(torch.uint8) for kv_cache in kv_caches]
    for kv_cache in expected:
        for src, dst in src_to_dst:
            kv_cache[:, dst] = kv_cache[:, src]
    copy_blocks(kv_caches, src_to_dst)
    for actual, wanted in zip(kv_caches, expected):
        assert torch.equal(actual.cpu().view(torch.uint8), wanted)

    gpu = random_cache(10, 16, 2, 64)
    host = torch.zeros(6, 16, 2, 64, dtype=torch.uint8).view(cache_dtype).pin_memory()
    swap_blocks(gpu, host, [(7, 0), (2, 5)])
    restored = torch.zeros_like(gpu)
    swap_blocks(host, restored, [(0, 1), (5, 9)])
    torch.cuda.current_stream().synchronize()
    gpu_bytes, restored_bytes = gpu.cpu().view(torch.uint8), restored.cpu().view(torch.uint8)
    assert torch.equal(host.view(torch.uint8)[0], gpu_bytes[7])
    assert torch.equal(restored_bytes[1], gpu_bytes[7]) and torch.equal(
        restored_bytes[9], gpu_bytes[2]
    )


@pytest.mark.parametrize("grouped", [False, True], ids=["per-head", "grouped"])
@pytest.mark.parametrize("prefill_kernel", [False, True], ids=["sdpa-prefill", "prefill-kernel"])
@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_backend_matches_reference(monkeypatch, dtype, cache_dtype, prefill_kernel, grouped):
    from pagedgen.attention.cupy_backend import CupyAttentionBackend
    from pagedgen.config import CudaAttentionConfig

    options = CudaAttentionConfig(prefill_kernel=prefill_kernel, grouped_decode=grouped)
    query_lens, context_lens = [1, 1, 1, 1, 20, 7], [1, 17, 100, 257, 20, 40]
    metadata = make_metadata(query_lens, context_lens, 16, 64, "cuda")
    num_tokens, num_heads, num_kv_heads, head_size = sum(query_lens), 8, 2, 128
    query = torch.randn(num_tokens, num_heads, head_size, device="cuda").to(dtype)
    key = torch.randn(num_tokens, num_kv_heads, head_size, device="cuda").to(dtype)
    value = (200 * torch.randn(num_tokens, num_kv_heads, head_size, device="cuda")).to(dtype)
    cache = to_cache_dtype(torch.randn(2, 64, 16, num_kv_heads, head_size), cache_dtype)
    ref_cache, cache = cache.clone(), cache.cuda()
    scale = head_size**-0.5
    backend = CupyAttentionBackend(torch.device("cuda"), head_size, 16, options)
    backend.prepare(metadata)
    out = forward(backend, query, key, value, cache[0], cache[1], metadata, scale)
    cpu_metadata = make_metadata(query_lens, context_lens, 16, 64, "cpu")
    expected = forward(
        ReferenceAttentionBackend(),
        query.cpu(),
        key.cpu(),
        value.cpu(),
        ref_cache[0],
        ref_cache[1],
        cpu_metadata,
        scale,
    )
    assert torch.equal(cache.cpu().view(torch.uint8), ref_cache.view(torch.uint8))
    tolerance = TOLERANCES[dtype] * (1 if prefill_kernel else 10)
    torch.testing.assert_close(out.cpu(), expected, atol=200 * tolerance, rtol=tolerance)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_engine_greedy_matches_torch_backend(tiny_llama_64: str, kv_cache_dtype: str) -> None:
    """Both backends read and write the same fp8 cache, rounded the same way."""
    options = {"kv_cache_dtype": kv_cache_dtype}
    expected = greedy_token_ids(tiny_llama_64, "torch", prompts(40), **options)
    assert greedy_token_ids(tiny_llama_64, "cupy", prompts(40), **options) == expected
