import pytest
import torch

from pagedgen.kernels.cache_ops import COPY_BLOCKS, RESHAPE_AND_CACHE
from pagedgen.kernels.launch import C_TYPES
from pagedgen.kernels.paged_attention import (
    BLOCK_SIZES,
    HEAD_SIZES,
    PARTITION_SIZE,
    paged_attention_module,
)
from pagedgen.kernels.source import kernel_source
from tests.kernels.emulator import Emulator, have_gxx
from tests.kernels.paged_cases import SMALL_PARTITION_SIZE


def _require_gxx() -> None:
    if not have_gxx():
        pytest.skip("g++ not found: the CPU emulation of the CUDA kernels is compiled with it")


@pytest.fixture(scope="session")
def attention_emulator() -> Emulator:
    """paged_attention.cu as the offline builds see it, plus the small-partition variants."""
    _require_gxx()
    names = {
        name
        for dtype in C_TYPES
        for head_size in HEAD_SIZES
        for block_size in BLOCK_SIZES
        for partition_size in (PARTITION_SIZE, SMALL_PARTITION_SIZE)
        for name in paged_attention_module(
            dtype, head_size, block_size, partition_size
        ).name_expressions
    }
    return Emulator(kernel_source("paged_attention.cu"), sorted(names))


@pytest.fixture(scope="session")
def cache_ops_emulators() -> dict[str, Emulator]:
    _require_gxx()
    return {
        module.source: Emulator(kernel_source(module.source), list(module.name_expressions))
        for module in (RESHAPE_AND_CACHE, COPY_BLOCKS)
    }


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)
