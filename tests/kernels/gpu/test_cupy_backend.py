"""The CuPy backend on a real GPU: kernels against the torch reference, the backend against the
reference backend, and the engine's greedy output against the torch backend. Skipped without
a CUDA GPU and CuPy."""

import pytest
import torch

from pagedgen.attention.reference import ReferenceAttentionBackend, write_kv_reference
from pagedgen.kernels import loader
from pagedgen.kernels.cache_ops import copy_blocks, reshape_and_cache, swap_blocks
from tests.attention.calls import forward
from tests.kernels.paged_cases import (
    DTYPES,
    bloom_alibi_slopes,
    check_decode,
    make_decode_case,
    make_metadata,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and loader.cupy_available()),
        reason="needs a CUDA GPU and CuPy (pip install 'pagedgen[cuda]')",
    ),
]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("head_size", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_attention(dtype: torch.dtype, block_size: int, head_size: int, version: int):
    case = make_decode_case(dtype, 8, 2, head_size, block_size, device="cuda")
    check_decode(loader.launch, case, version)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_attention_long_contexts(dtype: torch.dtype) -> None:
    """Real 512-token partitions: v2 with several of them, and v1 over the same contexts."""
    case = make_decode_case(dtype, 8, 1, 128, 16, context_lens=(600, 1500, 4097), device="cuda")
    check_decode(loader.launch, case, version=1)
    check_decode(loader.launch, case, version=2)


@pytest.mark.parametrize(
    ("window", "softcap", "sinks"), [(4096, 50.0, False), (128, None, True), (None, None, True)]
)
@pytest.mark.parametrize("version", [1, 2])
def test_paged_attention_windows_softcaps_sinks(version, window, softcap, sinks) -> None:
    """Gemma 2's window and soft cap; gpt-oss's heads of 64, GQA 8:1, window and sinks; over
    real partitions, blocks before each window freed."""
    context_lens = (600, 1500, 4097, 5000)
    shape = (16, 2, 128) if softcap else (64, 8, 64)
    case = make_decode_case(
        torch.bfloat16, *shape, 16, context_lens, device="cuda", window=window,
        softcap=softcap, sinks=sinks,
    )  # fmt: skip
    check_decode(loader.launch, case, version)


@pytest.mark.parametrize(
    ("window", "softcap", "sinks"),
    [(None, None, False), (None, 50.0, False), (1000, None, False), (None, None, True)],
)
@pytest.mark.parametrize("version", [1, 2])
def test_paged_attention_alibi(version, window, softcap, sinks) -> None:
    """MPT's shape (MHA, heads of 128) with BLOOM's slopes over real partitions: alone, under a
    soft cap, windowed (blocks before it freed), with sinks (which pin the bias's origin)."""
    context_lens = (600, 1500, 4097, 5000)
    case = make_decode_case(
        torch.bfloat16, 32, 32, 128, 16, context_lens, device="cuda", window=window,
        softcap=softcap, sinks=sinks, alibi=True,
    )  # fmt: skip
    check_decode(loader.launch, case, version)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reshape_and_cache(dtype: torch.dtype) -> None:
    key_cache = torch.randn(8, 16, 2, 128, device="cuda").to(dtype)
    value_cache = torch.randn_like(key_cache)
    kv = torch.randn(37, 6, 128, device="cuda").to(dtype)
    key, value = kv[:, :2], kv[:, 4:]
    slot_mapping = torch.randperm(8 * 16, device="cuda")[:37]
    slot_mapping[::4] = -1
    expected_key, expected_value = key_cache.cpu(), value_cache.cpu()
    write_kv_reference(key.cpu(), value.cpu(), expected_key, expected_value, slot_mapping.cpu())
    reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    assert torch.equal(bits(key_cache.cpu()), bits(expected_key))
    assert torch.equal(bits(value_cache.cpu()), bits(expected_value))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copy_blocks(dtype: torch.dtype) -> None:
    kv_caches = [torch.randn(2, 12, 16, 2, 64, device="cuda").to(dtype) for _ in range(3)]
    src_to_dst = [(0, 5), (0, 6), (3, 11)]
    expected = [kv_cache.cpu() for kv_cache in kv_caches]
    for kv_cache in expected:
        for src, dst in src_to_dst:
            kv_cache[:, dst] = kv_cache[:, src]
    copy_blocks(kv_caches, src_to_dst)
    for actual, wanted in zip(kv_caches, expected):
        assert torch.equal(bits(actual.cpu()), bits(wanted))


def test_swap_blocks_round_trip() -> None:
    gpu = torch.randn(10, 16, 2, 64, device="cuda", dtype=torch.float16)
    host = torch.zeros(6, 16, 2, 64, dtype=torch.float16).pin_memory()
    swap_blocks(gpu, host, [(7, 0), (2, 5)])
    restored = torch.zeros_like(gpu)
    swap_blocks(host, restored, [(0, 1), (5, 9)])
    torch.cuda.current_stream().synchronize()
    assert torch.equal(host[0], gpu[7].cpu()) and torch.equal(host[5], gpu[2].cpu())
    assert torch.equal(restored[1], gpu[7]) and torch.equal(restored[9], gpu[2])


def test_torch_backend_swap_out_lands_before_the_host_reads_it() -> None:
    """The torch backend's swap to a pageable host pool: a non-blocking copy to the host would
    return before its data landed, and the host-side index_copy_ would read zeros or old data."""
    from pagedgen.attention.torch_backend import TorchAttentionBackend

    backend = TorchAttentionBackend()
    for _ in range(3):
        gpu = [torch.randn(2, 64, 16, 8, 128, device="cuda") for _ in range(4)]
        host = [torch.zeros(2, 64, 16, 8, 128) for _ in range(4)]
        pairs = [(i, 63 - i) for i in range(0, 64, 2)]
        torch.cuda._sleep(10**7)  # keep the stream busy, as a step in flight would
        backend.swap_blocks(gpu, host, pairs)
        for g, h in zip(gpu, host):
            assert torch.equal(h[:, 63], g[:, 0].cpu()) and torch.equal(h[:, 1], g[:, 62].cpu())


@pytest.mark.parametrize("alibi", [False, True], ids=["plain", "alibi"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_backend_matches_reference(dtype: torch.dtype, alibi: bool) -> None:
    from pagedgen.attention.cupy_backend import CupyAttentionBackend

    # decodes (one query row each) first, then prefills with and without cached context
    query_lens, context_lens = [1, 1, 1, 1, 20, 7], [1, 17, 100, 257, 20, 40]
    metadata = make_metadata(query_lens, context_lens, 16, 64, "cuda")
    num_tokens, num_heads, num_kv_heads, head_size = sum(query_lens), 8, 2, 128
    query = torch.randn(num_tokens, num_heads, head_size, device="cuda").to(dtype)
    key = torch.randn(num_tokens, num_kv_heads, head_size, device="cuda").to(dtype)
    value = torch.randn_like(key)
    cache = torch.randn(2, 64, 16, num_kv_heads, head_size, device="cuda").to(dtype)
    ref_cache = cache.cpu()
    scale = head_size**-0.5
    alibi_slopes = bloom_alibi_slopes(num_heads) if alibi else None
    backend = CupyAttentionBackend(torch.device("cuda"), head_size, 16)
    backend.prepare(metadata)
    out = forward(backend, 
        query, key, value, cache[0], cache[1], metadata, scale,
        alibi_slopes=None if alibi_slopes is None else alibi_slopes.cuda(),
    )  # fmt: skip
    cpu_metadata = make_metadata(query_lens, context_lens, 16, 64, "cpu")
    expected = forward(ReferenceAttentionBackend(), 
        query.cpu(), key.cpu(), value.cpu(), ref_cache[0], ref_cache[1], cpu_metadata, scale,
        alibi_slopes=alibi_slopes,
    )  # fmt: skip
    tolerance = 1e-4 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.cpu(), expected, atol=tolerance, rtol=tolerance)
    assert torch.equal(bits(cache.cpu()), bits(ref_cache))


def greedy_token_ids(
    model: str, backend: str, prompts: list[str], **engine_options: str
) -> list[list[int]]:
    from pagedgen import LLM, SamplingParams

    llm = LLM(
        model,
        attention_backend=backend,
        device="cuda",
        dtype="float32",
        kv_cache_memory=1,
        **engine_options,
    )
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    del llm
    torch.cuda.empty_cache()
    return [output.outputs[0].token_ids for output in outputs]


def prompts(num_repeats: int) -> list[str]:
    """Short prompts decode with v1; the long one (over 512 tokens) with v2."""
    return ["The capital of France is", "def fibonacci(n):", "Once upon a time, " * num_repeats]


def test_engine_greedy_matches_torch_backend_tiny(tiny_llama_64: str) -> None:
    expected = greedy_token_ids(tiny_llama_64, "torch", prompts(40))
    assert greedy_token_ids(tiny_llama_64, "cupy", prompts(40)) == expected


def test_engine_greedy_matches_torch_backend_smollm2(smollm2_path) -> None:
    expected = greedy_token_ids(str(smollm2_path), "torch", prompts(100))
    assert greedy_token_ids(str(smollm2_path), "cupy", prompts(100)) == expected
