"""CupyAttentionBackend over fp8 caches end to end on the CPU: every kernel launch goes to the
emulator, and a step must match the reference backend over caches of the same dtype (written
with to_cache_dtype), byte for byte in the cache. A prompt's output must not depend on whether
its K/V were written in this step or an earlier one."""

import pytest
import torch

from pagedgen.attention.cupy_backend import CupyAttentionBackend
from pagedgen.attention.kv_cache_dtype import to_cache_dtype
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.reference import ReferenceAttentionBackend
from pagedgen.kernels import loader
from pagedgen.layers.rotary import Rope
from tests.attention.calls import forward, forward_qkv
from tests.kernels.emulator import emulate, have_gxx
from tests.kernels.paged_cases import FP8_DTYPES, TOLERANCES, make_metadata

pytestmark = pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation")

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE, NUM_BLOCKS = 4, 2, 64, 16, 24


@pytest.fixture
def backend(monkeypatch) -> CupyAttentionBackend:
    monkeypatch.setattr(loader, "launch", emulate)
    backend = CupyAttentionBackend.__new__(CupyAttentionBackend)  # __init__ insists on a GPU
    backend.use_prefill_kernel = True
    return backend


def make_cache(cache_dtype: torch.dtype) -> torch.Tensor:  # [2, num_blocks, block, heads, head]
    shape = (2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
    return to_cache_dtype(torch.randn(shape), cache_dtype)


def assert_same_bytes(cache: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.equal(cache.view(torch.uint8), expected.view(torch.uint8))


def step(
    backend: CupyAttentionBackend,
    metadata: AttentionMetadata,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    **kwargs,
) -> None:
    """One layer's forward on the backend and on the reference, from the same inputs; values
    past E4M3's 448 saturate."""
    num_tokens = sum(metadata.query_lens_cpu)
    query = torch.randn(num_tokens, NUM_HEADS, HEAD_SIZE).to(dtype)
    key = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_SIZE).to(dtype)
    value = (200 * torch.randn(num_tokens, NUM_KV_HEADS, HEAD_SIZE)).to(dtype)
    cache = make_cache(cache_dtype)
    ref_cache = cache.clone()
    args = (metadata, HEAD_SIZE**-0.5)
    backend.prepare(metadata)
    out = forward(backend, query, key, value, *cache, *args, **kwargs)
    expected = forward(ReferenceAttentionBackend(), query, key, value, *ref_cache, *args, **kwargs)
    assert_same_bytes(cache, ref_cache)
    # SDPA and the torch decode path round as their own kernels do.
    tolerance = TOLERANCES[dtype] * (1 if backend.use_prefill_kernel and not kwargs else 10)
    torch.testing.assert_close(out, expected, atol=tolerance * 200, rtol=tolerance)


@pytest.mark.parametrize("prefill_kernel", [False, True], ids=["sdpa-prefill", "prefill-kernel"])
@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_step_matches_reference(backend, dtype, cache_dtype, prefill_kernel: bool) -> None:
    # decodes (one query row each) first, then prefills with and without cached context
    query_lens, context_lens = [1, 1, 1, 20, 7], [1, 17, 100, 20, 40]
    metadata = make_metadata(query_lens, context_lens, BLOCK_SIZE, NUM_BLOCKS, "cpu")
    backend.use_prefill_kernel = prefill_kernel
    step(backend, metadata, dtype, cache_dtype)


def test_grouped_decode(backend) -> None:
    metadata = make_metadata([1, 1, 1], [1, 17, 100], BLOCK_SIZE, NUM_BLOCKS, "cpu")
    backend.use_grouped_decode = True
    step(backend, metadata, torch.float16, torch.float8_e4m3fn)


def test_window_and_softcap_layer(backend) -> None:
    """Such layers' decode rows read fp8 caches through the kernels too."""
    metadata = make_metadata([1, 1, 12, 9], [30, 5, 12, 60], BLOCK_SIZE, NUM_BLOCKS, "cpu")
    step(backend, metadata, torch.bfloat16, torch.float8_e5m2, window=10, softcap=20.0)


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_forward_qkv(backend, dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    """rope_and_cache writes the roped K (rounded to dtype, then to fp8) and V, and attention
    reads them back from the cache."""
    query_lens, context_lens = [1, 1, 9, 5], [4, 30, 9, 21]
    metadata = make_metadata(query_lens, context_lens, BLOCK_SIZE, NUM_BLOCKS, "cpu")
    num_tokens = sum(query_lens)
    qkv = torch.randn(num_tokens, (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_SIZE).to(dtype)
    angles = torch.rand(num_tokens, 1, HEAD_SIZE // 2) * 6.3
    rope = Rope(angles.cos(), angles.sin())
    cache = make_cache(cache_dtype)
    ref_cache = cache.clone()
    args = (NUM_HEADS, NUM_KV_HEADS, rope)
    backend.prepare(metadata)
    out = forward_qkv(backend, qkv.clone(), *args, *cache, metadata, HEAD_SIZE**-0.5)
    expected = forward_qkv(
        ReferenceAttentionBackend(), qkv.clone(), *args, *ref_cache, metadata, HEAD_SIZE**-0.5
    )
    assert_same_bytes(cache, ref_cache)
    torch.testing.assert_close(out, expected, atol=TOLERANCES[dtype], rtol=TOLERANCES[dtype])


def check_chunking(backend: CupyAttentionBackend) -> None:
    """A 40-token prompt in one step, or in chunks of 24 and 16: the last 16 rows attend to the
    same K/V, rounded to E4M3 either way (over the float32 K/V they would differ by far more)."""
    prompt_len, first_chunk = 40, 24
    dtype, scale = torch.float32, HEAD_SIZE**-0.5
    query = torch.randn(prompt_len, NUM_HEADS, HEAD_SIZE)
    key, value = (torch.randn(prompt_len, NUM_KV_HEADS, HEAD_SIZE) for _ in range(2))
    outs = []
    for cache_dtype in (torch.float8_e4m3fn, dtype):
        whole = make_cache(cache_dtype)
        chunked = whole.clone()
        for cache, bounds in ((whole, [0, prompt_len]), (chunked, [0, first_chunk, prompt_len])):
            for start, end in zip(bounds, bounds[1:]):  # the same blocks, first come first
                metadata = make_metadata([end - start], [end], BLOCK_SIZE, NUM_BLOCKS, "cpu")
                backend.prepare(metadata)
                rows = slice(start, end)
                out = forward(backend, query[rows], key[rows], value[rows], *cache, metadata, scale)
            outs.append(out[-(prompt_len - first_chunk) :])
        assert_same_bytes(chunked, whole)
    fp8_whole, fp8_chunked, float_whole, _ = outs
    torch.testing.assert_close(fp8_chunked, fp8_whole, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(fp8_whole, float_whole, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("prefill_kernel", [False, True], ids=["sdpa-prefill", "prefill-kernel"])
def test_prompt_output_does_not_depend_on_chunking(backend, prefill_kernel: bool) -> None:
    backend.use_prefill_kernel = prefill_kernel
    check_chunking(backend)


def test_copy_blocks(backend) -> None:
    kv_caches = [make_cache(torch.float8_e5m2) for _ in range(2)]
    expected = [kv_cache.view(torch.uint8).clone() for kv_cache in kv_caches]
    for kv_cache in expected:
        kv_cache[:, 5] = kv_cache[:, 3]
    backend.copy_blocks(kv_caches, [(3, 5)])
    for kv_cache, wanted in zip(kv_caches, expected):
        assert_same_bytes(kv_cache, wanted)
