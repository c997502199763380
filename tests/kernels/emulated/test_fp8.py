"""fp8 KV caches in the CUDA kernels, on the CPU through cuda_emu.h: the conversions of
kernels/common.cuh are exact against torch (every code read by every attention kernel, writes of
every bfloat16 and float16 value and of float32 values at every rounding boundary), block copies
move their bytes, and the wrappers refuse what the kernels do not take."""

import pytest
import torch

from pagedgen.kernels.cache_ops import copy_blocks_launch, reshape_and_cache_launch
from pagedgen.kernels.paged_attention import paged_attention_launches
from pagedgen.kernels.prefill_attention import prefill_attention_launch
from pagedgen.kernels.source import kernel_source
from tests.kernels.emulator import Emulator, emulate, have_gxx
from tests.kernels.fp8_cases import (
    READ_KERNELS,
    check_conversions,
    check_reads,
    check_writes,
    hard_floats,
)
from tests.kernels.paged_cases import DTYPES, FP8_DTYPES, make_decode_case

pytestmark = pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation")


def test_conversions_match_torch() -> None:
    check_conversions(kernel_source("common.cuh"))


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_writes_match_to_cache_dtype(cache_ops_emulators, dtype, cache_dtype) -> None:
    check_writes(cache_ops_emulators["reshape_and_cache.cu"].launch, dtype, cache_dtype)


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kernel", READ_KERNELS)
def test_reads_are_exact(kernel: str, dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    check_reads(emulate, kernel, dtype, cache_dtype)


def test_hard_floats_cover_ties_and_saturation() -> None:
    """The write checks' float32 values reach every case of the conversion: ties that round down
    and up to even, the saturating bounds, float subnormals, infinities and NaN."""
    x = hard_floats()
    assert {0.0, 448.0, 464.0, 57344.0, 61440.0} <= set(x.tolist())
    assert 2.0**-10 in x and 3 * 2.0**-10 in x  # E4M3's subnormal ties: to 0 and to 2 * 2^-9
    assert x.isnan().any() and x.isinf().any() and (x.abs() < 1.2e-38).any()


def check_copy_blocks(emulator: Emulator, cache_dtype: torch.dtype) -> None:
    kv_caches = [
        torch.randint(0, 256, (2, 10, 16, 2, 64), dtype=torch.uint8).view(cache_dtype)
        for _ in range(3)
    ]
    src_to_dst = [(1, 3), (4, 0), (1, 2)]
    expected = [kv_cache.view(torch.uint8).clone() for kv_cache in kv_caches]
    for kv_cache in expected:
        for src, dst in src_to_dst:
            kv_cache[:, dst] = kv_cache[:, src]
    plan = copy_blocks_launch(kv_caches, src_to_dst)
    assert plan is not None
    emulator.launch(plan)
    for actual, wanted in zip(kv_caches, expected):
        assert torch.equal(actual.view(torch.uint8), wanted)


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
def test_copy_blocks_moves_the_bytes(cache_ops_emulators, cache_dtype: torch.dtype) -> None:
    check_copy_blocks(cache_ops_emulators["copy_blocks.cu"], cache_dtype)


def test_plans_name_the_cache_type() -> None:
    case = make_decode_case(torch.bfloat16, 4, 2, 64, 16, cache_dtype=torch.float8_e5m2)
    plans = paged_attention_launches(
        torch.empty_like(case.query), *case[:5], case.max_context_len, case.scale, version=2
    )
    assert "<__nv_bfloat16, pagedgen::fp8_e5m2, 64, 16, 128, 512>" in plans[0].name_expression
    assert "PAGEDGEN_CACHE_T=pagedgen::fp8_e5m2" in plans[0].module.defines
    assert "reduce_kernel<__nv_bfloat16, 64, 128, 512>" in plans[1].name_expression


@pytest.mark.parametrize(
    ("cache_dtype", "message"),
    [(torch.float16, "must be torch.float32 or one of"), (torch.int8, "must be torch.float32")],
    ids=str,
)
def test_wrappers_reject_other_cache_dtypes(cache_dtype: torch.dtype, message: str) -> None:
    query = torch.zeros(2, 4, 64)
    cache = torch.zeros(4, 16, 2, 64, dtype=cache_dtype)
    tables, lens = torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        paged_attention_launches(torch.empty_like(query), query, cache, cache, tables, lens, 1, 1.0)
    cu_seqlens_q = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        prefill_attention_launch(
            torch.empty_like(query), query, cache, cache, tables, cu_seqlens_q, lens, 1, 1.0
        )
    key, slots = torch.zeros(3, 2, 64), torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match=message):
        reshape_and_cache_launch(key, key, cache, cache, slots)


def test_wrappers_reject_mismatched_fp8_caches() -> None:
    query = torch.zeros(2, 4, 64, dtype=torch.float16)
    key_cache = torch.zeros(4, 16, 2, 64, dtype=torch.float8_e4m3fn)
    value_cache = key_cache.view(torch.float8_e5m2)
    tables, lens = torch.zeros(2, 1, dtype=torch.int32), torch.ones(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="value_cache must be torch.float8_e4m3fn"):
        paged_attention_launches(
            torch.empty_like(query), query, key_cache, value_cache, tables, lens, 1, 1.0
        )
    with pytest.raises(ValueError, match="dtype must be one of"):  # fp8 activations
        reshape_and_cache_launch(
            key_cache[0, :3], key_cache[0, :3], key_cache, key_cache, torch.zeros(3).long()
        )
