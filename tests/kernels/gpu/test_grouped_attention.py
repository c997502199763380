"""The GQA-grouped decode kernels on a real GPU: against the torch reference and against the
per-head kernel, with the planner's own v1/v2 choice and forced versions. Skipped without a CUDA
GPU and CuPy."""

import pytest
import torch

from pagedgen.kernels import loader
from pagedgen.kernels.attention_args import HEAD_SIZES
from tests.kernels.paged_cases import (
    DTYPES,
    TOLERANCES,
    backend_decode_kernels,
    check_decode,
    make_decode_case,
    run_decode,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and loader.cupy_available()),
        reason="needs a CUDA GPU and CuPy (pip install 'pagedgen[cuda]')",
    ),
]

GQA_RATIOS = [(9, 3), (8, 2), (32, 8), (8, 1), (12, 1)]
# Groups of 3 in tiles of 4, one tile of 8, tiles of 8 and 4 (head size 256: of 4 and 4 and 4).
TILE_CASES = [(9, 3), (8, 1), (12, 1)]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), TILE_CASES, ids=str)
@pytest.mark.parametrize("head_size", HEAD_SIZES)
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grouped_matches_reference(
    dtype: torch.dtype,
    block_size: int,
    head_size: int,
    num_heads: int,
    num_kv_heads: int,
    version: int,
) -> None:
    case = make_decode_case(dtype, num_heads, num_kv_heads, head_size, block_size, device="cuda")
    check_decode(loader.launch, case, version, partition_size=64, grouped=True)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), GQA_RATIOS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grouped_long_contexts(dtype: torch.dtype, num_heads: int, num_kv_heads: int) -> None:
    """The planner's partitions (a single sequence gets small ones), and forced v1 and v2."""
    contexts = (600, 1500, 4097)
    for context_lens in (contexts, contexts[-1:]):
        case = make_decode_case(
            dtype, num_heads, num_kv_heads, 128, 16, context_lens=context_lens, device="cuda"
        )
        check_decode(loader.launch, case, version=None, grouped=True)
        check_decode(loader.launch, case, version=1, grouped=True)
        check_decode(loader.launch, case, version=2, grouped=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grouped_matches_per_head_kernel(dtype: torch.dtype) -> None:
    """Both kernels sum in float32 over the same rounded inputs: they agree within the output's
    rounding, at every planner choice."""
    for context_lens in ((1, 17, 100, 257, 3000), (8000,)):
        case = make_decode_case(dtype, 32, 8, 128, 16, context_lens=context_lens, device="cuda")
        grouped = run_decode(loader.launch, case, version=None, grouped=True)
        per_head = run_decode(loader.launch, case, version=None)
        tolerance = TOLERANCES[dtype]
        torch.testing.assert_close(grouped, per_head, atol=tolerance, rtol=tolerance)


def test_backend_decodes_with_the_grouped_kernel(monkeypatch) -> None:
    """grouped_decode=True reaches the launch plan."""
    names = backend_decode_kernels(monkeypatch, "grouped_decode")
    assert any("grouped" in name for name in names), names
