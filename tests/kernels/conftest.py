import pytest
import torch

from pagedgen.kernels.attention_args import BLOCK_SIZES, HEAD_SIZES
from pagedgen.kernels.cache_ops import COPY_BLOCKS, reshape_and_cache_module
from pagedgen.kernels.launch import C_TYPES, cache_dtypes
from pagedgen.kernels.paged_attention import PARTITION_SIZE, paged_attention_module
from pagedgen.kernels.source import kernel_source
from tests.kernels.emulator import Emulator, have_gxx
from tests.kernels.paged_cases import SMALL_PARTITION_SIZE


def _require_gxx() -> None:
    if not have_gxx():
        pytest.skip("g++ not found: the CPU emulation of the CUDA kernels is compiled with it")


@pytest.fixture(scope="session")
def attention_emulator() -> Emulator:
    """paged_attention.cu's kernels for caches of the query's dtype, every instantiation that the
    runtime may compile plus the small-partition variants, in one library (the entry points
    instantiate what the -D macros of one module leave out)."""
    _require_gxx()
    modules = [
        paged_attention_module(dtype, head_size, block_size, partition_size)
        for dtype in C_TYPES
        for head_size in HEAD_SIZES
        for block_size in BLOCK_SIZES
        for partition_size in (PARTITION_SIZE, SMALL_PARTITION_SIZE)
    ]
    names = {name for module in modules for name in module.name_expressions}
    return Emulator(kernel_source("paged_attention.cu"), sorted(names), modules[0].defines)


@pytest.fixture(scope="session")
def cache_ops_emulators() -> dict[str, Emulator]:
    """reshape_and_cache.cu for every (activation, cache) dtype pair, and copy_blocks.cu."""
    _require_gxx()
    reshape = [reshape_and_cache_module(d, c) for d in C_TYPES for c in cache_dtypes(d)]
    names = [module.name_expressions[0] for module in reshape]
    return {
        "reshape_and_cache.cu": Emulator(
            kernel_source("reshape_and_cache.cu"), names, reshape[0].defines
        ),
        "copy_blocks.cu": Emulator(
            kernel_source("copy_blocks.cu"), list(COPY_BLOCKS.name_expressions)
        ),
    }


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)
