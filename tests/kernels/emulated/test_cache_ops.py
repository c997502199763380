"""kernels/reshape_and_cache.cu and kernels/copy_blocks.cu on the CPU: bit-exact against torch."""

import pytest
import torch

from pagedgen.attention.reference import write_kv_reference
from pagedgen.kernels.cache_ops import copy_blocks_launch, reshape_and_cache_launch
from tests.kernels.paged_cases import DTYPES


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


@pytest.mark.parametrize(("num_kv_heads", "head_size", "block_size"), [(2, 64, 16), (1, 80, 8)])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reshape_and_cache(
    cache_ops_emulators, dtype: torch.dtype, num_kv_heads: int, head_size: int, block_size: int
) -> None:
    num_blocks, num_tokens = 6, 21
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache, value_cache = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    # key and value are views into a fused projection, rows wider than num_kv_heads * head_size.
    kv = torch.randn(num_tokens, 3 * num_kv_heads, head_size).to(dtype)
    key, value = kv[:, :num_kv_heads], kv[:, 2 * num_kv_heads :]
    slot_mapping = torch.randperm(num_blocks * block_size)[:num_tokens]
    slot_mapping[::5] = -1
    expected_key, expected_value = key_cache.clone(), value_cache.clone()
    write_kv_reference(key, value, expected_key, expected_value, slot_mapping)

    launch = reshape_and_cache_launch(key, value, key_cache, value_cache, slot_mapping)
    cache_ops_emulators["reshape_and_cache.cu"].launch(launch)
    assert torch.equal(bits(key_cache), bits(expected_key))
    assert torch.equal(bits(value_cache), bits(expected_value))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("planes", [2, 1])  # K and V; MLA's one latent per layer
def test_copy_blocks(cache_ops_emulators, dtype: torch.dtype, planes: int) -> None:
    num_layers, num_blocks = 3, 10
    shape = (planes, num_blocks, 16, 2, 64)
    kv_caches = [torch.randn(shape).to(dtype) for _ in range(num_layers)]
    src_to_dst = [(1, 7), (1, 8), (4, 2), (9, 0)]
    expected = [kv_cache.clone() for kv_cache in kv_caches]
    for kv_cache in expected:
        for src, dst in src_to_dst:
            kv_cache[:, dst] = kv_cache[:, src]

    cache_ops_emulators["copy_blocks.cu"].launch(copy_blocks_launch(kv_caches, src_to_dst))
    for actual, wanted in zip(kv_caches, expected):
        assert torch.equal(bits(actual), bits(wanted))


def test_copy_blocks_rejects_chained_pairs() -> None:
    kv_caches = [torch.zeros(2, 4, 8, 1, 64)]
    with pytest.raises(ValueError, match="both a copy source and a destination"):
        copy_blocks_launch(kv_caches, [(0, 1), (1, 2)])


def test_reshape_and_cache_rejects_mismatched_heads() -> None:
    cache = torch.zeros(4, 16, 2, 64)
    key = torch.zeros(3, 1, 64)
    with pytest.raises(ValueError, match="does not match the cache"):
        reshape_and_cache_launch(key, key, cache, cache.clone(), torch.zeros(3, dtype=torch.int64))
