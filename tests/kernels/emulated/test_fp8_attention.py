"""The decode (v1, v2, GQA-grouped) and prefill attention kernels over fp8 caches, on the CPU
through cuda_emu.h, against the torch reference over the same caches dequantized: the same
scattered, NaN-poisoned batches as the tests of caches in the model's dtype, with the same
tolerances, for E4M3 and E5M2 under float32, float16 and bfloat16 activations."""

import pytest
import torch

from tests.kernels.emulator import emulate, have_gxx
from tests.kernels.paged_cases import (
    DTYPES,
    FP8_DTYPES,
    SMALL_PARTITION_SIZE,
    check_decode,
    make_decode_case,
)
from tests.kernels.prefill_cases import check_prefill, make_prefill_case

pytestmark = pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation")


def check_decode_versions(case, grouped: bool = False) -> None:
    """v1, and v2 over 64-token partitions (the longer contexts span several)."""
    for version in (1, 2):
        check_decode(emulate, case, version, SMALL_PARTITION_SIZE, grouped=grouped)


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode(dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    case = make_decode_case(dtype, 4, 2, 128, 16, seed=1, cache_dtype=cache_dtype)
    check_decode_versions(case)


@pytest.mark.parametrize(
    ("dtype", "cache_dtype", "head_size", "block_size"),
    [
        (torch.float16, torch.float8_e4m3fn, 64, 8),
        (torch.float16, torch.float8_e4m3fn, 80, 32),
        (torch.bfloat16, torch.float8_e5m2, 96, 8),
        (torch.float32, torch.float8_e5m2, 256, 16),
    ],
    ids=str,
)
def test_decode_head_and_block_sizes(dtype, cache_dtype, head_size: int, block_size: int) -> None:
    """Head sizes of 5 and 6 fp8 vectors (80, 96) leave lanes of a value row idle."""
    case = make_decode_case(dtype, 4, 1, head_size, block_size, seed=2, cache_dtype=cache_dtype)
    check_decode_versions(case)


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grouped_decode(dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    """Groups of 3 in tiles of 4, each fp8 vector serving every head of its tile."""
    case = make_decode_case(dtype, 9, 3, 64, 16, seed=3, cache_dtype=cache_dtype)
    check_decode_versions(case, grouped=True)


@pytest.mark.parametrize(
    ("num_heads", "head_size", "block_size"), [(12, 128, 8), (8, 256, 32)], ids=str
)
def test_grouped_decode_tiles(num_heads: int, head_size: int, block_size: int) -> None:
    """Tiles of 8 and 4 heads (head size 128), and of 4 for head size 256."""
    case = make_decode_case(
        torch.bfloat16, num_heads, 1, head_size, block_size, seed=4, cache_dtype=torch.float8_e4m3fn
    )
    check_decode_versions(case, grouped=True)


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill(dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    """Whole prompts (no cached prefix) and chunks after a cached prefix, GQA 4:1."""
    case = make_prefill_case(dtype, 8, 2, 64, 16, seed=5, cache_dtype=cache_dtype)
    check_prefill(emulate, case)


@pytest.mark.parametrize(
    ("dtype", "cache_dtype", "head_size", "block_size"),
    [
        (torch.float16, torch.float8_e5m2, 80, 8),
        (torch.bfloat16, torch.float8_e4m3fn, 256, 32),
    ],
    ids=str,
)
def test_prefill_head_and_block_sizes(dtype, cache_dtype, head_size: int, block_size: int) -> None:
    case = make_prefill_case(dtype, 4, 2, head_size, block_size, seed=6, cache_dtype=cache_dtype)
    check_prefill(emulate, case)


def test_prefill_window_and_softcap() -> None:
    """A window over a freed (NaN) prefix, and soft-capped scores."""
    case = make_prefill_case(
        torch.bfloat16, 4, 2, 128, 16, window=20, softcap=3.0, cache_dtype=torch.float8_e4m3fn
    )
    check_prefill(emulate, case)
