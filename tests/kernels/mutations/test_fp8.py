"""The fp8 checks must catch typical bugs of 8-bit float caches: each conversion bug below is
planted into a copy of kernels/common.cuh and must fail the exhaustive conversion checks; a copy
of fp8 blocks with 2-byte elements must fail the block copy check; and attention over this
step's K/V as computed, not as the fp8 cache holds them, must fail the chunking check."""

import pytest
import torch

from pagedgen.attention import torch_backend
from pagedgen.attention.cupy_backend import CupyAttentionBackend
from pagedgen.kernels import cache_ops, loader
from pagedgen.kernels.source import kernel_source
from tests.kernels.emulated.test_fp8 import check_copy_blocks
from tests.kernels.emulated.test_fp8_backend import check_chunking
from tests.kernels.emulator import EmulationError, emulate, have_gxx
from tests.kernels.fp8_cases import check_conversions
from tests.kernels.mutations.test_paged_attention import mutate

pytestmark = [
    pytest.mark.slow,  # each mutation builds its own copy of a kernel
    pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation"),
]

# name: (original text, planted bug, how often the text occurs)
CONVERSION_MUTATIONS = {
    "e4m3_exponent_bias_off_by_one": ("kBias = 7, kManBits = 3;", "kBias = 8, kManBits = 3;", 1),
    "no_saturation": ("} else if (a >= kMax) {", "} else if (false) {", 1),
    "truncation_not_round_to_nearest": (
        "const unsigned rounded = a + (1u << (kDropped - 1)) - 1u + ((a >> kDropped) & 1u);",
        "const unsigned rounded = a;",
        1,
    ),
    "ties_away_from_zero": (
        "const unsigned rounded = a + (1u << (kDropped - 1)) - 1u + ((a >> kDropped) & 1u);",
        "const unsigned rounded = a + (1u << (kDropped - 1));",
        1,
    ),
    "subnormals_flushed_to_zero": (
        "magnitude = static_cast<unsigned>(rintf(",
        "magnitude = 0u * static_cast<unsigned>(rintf(",
        1,
    ),
    "subnormals_truncated": ("static_cast<unsigned>(rintf(", "static_cast<unsigned>(truncf(", 1),
    "nan_saturates": ("if (a > 0x7f800000u) {", "if (false) {", 1),
    "sign_dropped_on_write": ("((u >> 24 & 0x80u) | magnitude)", "(magnitude)", 1),
    "e4m3_read_with_e5m2_bias": ("value * 256.f", "value * 65536.f", 1),
    "e4m3_nan_read_as_480": ("magnitude == 0x7fu ? __uint_as_float", "false ? __uint_as_float", 1),
    "e5m2_read_as_e4m3_fields": (
        "static_cast<unsigned short>(x.bits << 8)",
        "static_cast<unsigned short>(x.bits << 7)",
        1,
    ),
}


def conversions_pass(common_source: str) -> bool:
    try:
        check_conversions(common_source)
    except (AssertionError, EmulationError):
        return False
    return True


def test_original_conversions_pass() -> None:
    assert conversions_pass(kernel_source("common.cuh"))


@pytest.mark.parametrize("name", CONVERSION_MUTATIONS)
def test_conversion_mutation_is_caught(name: str) -> None:
    source = mutate(kernel_source("common.cuh"), *CONVERSION_MUTATIONS[name])
    assert not conversions_pass(source), f"the conversion checks miss the bug {name!r}"


def test_copy_with_2_byte_elements_is_caught(monkeypatch, cache_ops_emulators) -> None:
    """fp8 blocks copied as __half: every offset and length doubled (the blocks the check copies
    keep those inside the caches)."""
    monkeypatch.setitem(cache_ops.COPY_C_TYPES, torch.float8_e4m3fn, "__half")
    with pytest.raises(AssertionError):
        check_copy_blocks(cache_ops_emulators["copy_blocks.cu"], torch.float8_e4m3fn)


def test_prefill_over_unrounded_fresh_kv_is_caught(monkeypatch) -> None:
    """The torch path's prefill (the cupy backend's with prefill_kernel=False) taking a
    whole prompt's K/V from the activations without rounding them through the cache dtype."""
    monkeypatch.setattr(loader, "launch", emulate)
    backend = CupyAttentionBackend.__new__(CupyAttentionBackend)
    backend.use_prefill_kernel = False
    check_chunking(backend)
    monkeypatch.setattr(torch_backend, "round_through_cache", lambda x, dtype: x)
    with pytest.raises(AssertionError):
        check_chunking(backend)
