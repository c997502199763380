"""CupyAttentionBackend end to end on the CPU: its kernel launches go to the emulator (its prefill
rows to torch's SDPA unless the prefill kernel is on), and the result must match the reference
backend on a mixed batch."""

import pytest
import torch

from pagedgen.attention.cupy_backend import CupyAttentionBackend
from pagedgen.attention.reference import ReferenceAttentionBackend
from pagedgen.kernels import loader
from pagedgen.kernels.launch import KernelLaunch
from tests.kernels.paged_cases import TOLERANCES, make_metadata
from tests.kernels.prefill_cases import emulate


@pytest.fixture
def emulated_backend(monkeypatch, attention_emulator, cache_ops_emulators) -> CupyAttentionBackend:
    emulators = {"paged_attention.cu": attention_emulator.launch, "prefill_attention.cu": emulate}
    emulators |= {source: emulator.launch for source, emulator in cache_ops_emulators.items()}

    def launch(kernel_launch: KernelLaunch) -> None:
        emulators[kernel_launch.module.source](kernel_launch)

    monkeypatch.setattr(loader, "launch", launch)
    return CupyAttentionBackend.__new__(CupyAttentionBackend)  # __init__ insists on a GPU


@pytest.mark.parametrize("prefill_kernel", [False, True], ids=["sdpa-prefill", "prefill-kernel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_backend_matches_reference(emulated_backend, dtype: torch.dtype, prefill_kernel) -> None:
    # decodes (one query row each) first, then prefills with and without cached context
    query_lens, context_lens = [1, 1, 1, 20, 7], [1, 17, 100, 20, 40]
    metadata = make_metadata(query_lens, context_lens, 16, 24, "cpu")
    num_tokens, num_heads, num_kv_heads, head_size = sum(query_lens), 4, 2, 64
    query = torch.randn(num_tokens, num_heads, head_size).to(dtype)
    key = torch.randn(num_tokens, num_kv_heads, head_size).to(dtype)
    value = torch.randn_like(key)
    cache = torch.randn(2, 24, 16, num_kv_heads, head_size).to(dtype)
    ref_cache = cache.clone()
    scale = head_size**-0.5

    emulated_backend.use_prefill_kernel = prefill_kernel  # PAGEDGEN_CUDA_PREFILL_KERNEL
    emulated_backend.prepare(metadata)
    out = emulated_backend.forward(query, key, value, cache[0], cache[1], metadata, scale)
    expected = ReferenceAttentionBackend().forward(
        query, key, value, ref_cache[0], ref_cache[1], metadata, scale
    )
    tolerance = TOLERANCES[dtype] * (1 if prefill_kernel else 10)  # SDPA's own rounding
    torch.testing.assert_close(out, expected, atol=tolerance, rtol=tolerance)
    assert torch.equal(cache, ref_cache)


def test_backend_rejects_unsupported_sizes_when_built(monkeypatch) -> None:
    monkeypatch.setattr(loader, "cupy_available", lambda: True)
    with pytest.raises(ValueError, match="block sizes"):
        CupyAttentionBackend(torch.device("cuda"), 64, 64)
    with pytest.raises(ValueError, match="head sizes"):
        CupyAttentionBackend(torch.device("cuda"), 72, 16)
