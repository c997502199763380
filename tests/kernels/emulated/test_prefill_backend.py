"""CupyAttentionBackend's prefill rows on the CPU: every kernel launch goes to the emulator, and
the whole step must match the reference backend, with one prefill launch per forward."""

from collections import Counter

import pytest
import torch

from pagedgen.attention.cupy_backend import CupyAttentionBackend
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.reference import ReferenceAttentionBackend
from pagedgen.kernels import loader
from pagedgen.kernels.launch import KernelLaunch
from tests.attention.calls import forward
from tests.kernels.emulator import emulate
from tests.kernels.paged_cases import TOLERANCES, bloom_alibi_slopes, make_metadata

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE, NUM_BLOCKS = 6, 2, 64, 16, 40


@pytest.fixture
def launches(monkeypatch, attention_emulator, cache_ops_emulators) -> Counter[str]:
    """Sends the backend's launches to the emulators; counts them by kernel source."""
    emulators = {"paged_attention.cu": attention_emulator.launch, "prefill_attention.cu": emulate}
    emulators |= {source: emulator.launch for source, emulator in cache_ops_emulators.items()}
    counts: Counter[str] = Counter()

    def launch(kernel_launch: KernelLaunch) -> None:
        counts[kernel_launch.module.source] += 1
        emulators[kernel_launch.module.source](kernel_launch)

    monkeypatch.setattr(loader, "launch", launch)
    return counts


def run_step(
    metadata: AttentionMetadata,
    dtype: torch.dtype,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> None:
    """One layer's forward on the backend and on the reference, from the same inputs."""
    num_tokens = sum(metadata.query_lens_cpu)
    query = torch.randn(num_tokens, NUM_HEADS, HEAD_SIZE).to(dtype)
    key = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_SIZE).to(dtype)
    value = torch.randn_like(key)
    cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE).to(dtype)
    ref_cache = cache.clone()
    scale = HEAD_SIZE**-0.5

    backend = CupyAttentionBackend.__new__(CupyAttentionBackend)  # __init__ insists on a GPU
    backend.use_prefill_kernel = True  # prefill_kernel=True
    # the CUDA-core kernels (test_emulated_backend.py takes 16-bit layers to the tensor-core ones)
    backend.use_tensor_core_decode = backend.use_tensor_core_prefill = False
    backend.prepare(metadata)
    args = (metadata, scale, window, softcap, sinks, alibi_slopes)
    out = forward(backend, query, key, value, cache[0], cache[1], *args)
    expected = forward(
        ReferenceAttentionBackend(), query, key, value, ref_cache[0], ref_cache[1], *args
    )
    tolerance = TOLERANCES[dtype]
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    assert torch.equal(cache, ref_cache)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_mixed_step_matches_reference(launches, dtype: torch.dtype) -> None:
    # decodes first, then a whole prompt and chunks after cached prefixes (GQA 3:1)
    query_lens, context_lens = [1, 1, 1, 20, 7, 33], [1, 17, 100, 20, 40, 90]
    run_step(make_metadata(query_lens, context_lens, BLOCK_SIZE, NUM_BLOCKS, "cpu"), dtype)
    assert launches == {
        "reshape_and_cache.cu": 1,
        "paged_attention.cu": 1,
        "prefill_attention.cu": 1,
    }


def test_prefill_only_step(launches) -> None:
    query_lens, context_lens = [5, 40, 1], [5, 40, 64]
    run_step(make_metadata(query_lens, context_lens, BLOCK_SIZE, NUM_BLOCKS, "cpu"), torch.float32)
    assert launches["prefill_attention.cu"] == 1 and launches["paged_attention.cu"] == 0


def test_window_and_softcap_layer(launches) -> None:
    """Windowed, soft-capped layers (Gemma 2): decode and prefill rows through our kernels."""
    query_lens, context_lens = [1, 1, 12, 9], [30, 5, 12, 60]
    metadata = make_metadata(query_lens, context_lens, BLOCK_SIZE, NUM_BLOCKS, "cpu")
    run_step(metadata, torch.float32, window=10, softcap=20.0)
    assert launches["prefill_attention.cu"] == 1 and launches["paged_attention.cu"] == 1


def test_a_sinks_layer_attends_through_the_kernels(launches) -> None:
    """gpt-oss's windowed layers with sinks: one decode and one prefill launch."""
    query_lens, context_lens = [1, 1, 20, 7], [1, 17, 20, 40]
    metadata = make_metadata(query_lens, context_lens, BLOCK_SIZE, NUM_BLOCKS, "cpu")
    sinks = torch.linspace(-4.0, 4.0, NUM_HEADS)
    run_step(metadata, torch.float32, window=9, sinks=sinks)
    assert launches == {
        "reshape_and_cache.cu": 1,
        "paged_attention.cu": 1,
        "prefill_attention.cu": 1,
    }


@pytest.mark.parametrize(("window", "softcap"), [(None, None), (9, 20.0)], ids=str)
def test_an_alibi_layer_attends_through_the_kernels(launches, window, softcap) -> None:
    """BLOOM's and MPT's ALiBi (here under a window and a soft cap too): one decode and one
    prefill launch, each head biased by its own slope."""
    query_lens, context_lens = [1, 1, 20, 7, 33], [1, 50, 20, 40, 90]
    metadata = make_metadata(query_lens, context_lens, BLOCK_SIZE, NUM_BLOCKS, "cpu")
    alibi_slopes = bloom_alibi_slopes(NUM_HEADS)
    run_step(metadata, torch.float32, window, softcap, alibi_slopes=alibi_slopes)
    assert launches == {
        "reshape_and_cache.cu": 1,
        "paged_attention.cu": 1,
        "prefill_attention.cu": 1,
    }
