"""The prefill attention kernel on a real GPU against the torch reference. Skipped without a CUDA
GPU and CuPy."""

import pytest
import torch

from pagedgen.kernels import loader
from pagedgen.kernels.attention_args import BLOCK_SIZES, HEAD_SIZES
from tests.kernels.paged_cases import DTYPES
from tests.kernels.prefill_cases import check_prefill, make_prefill_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and loader.cupy_available()),
        reason="needs a CUDA GPU and CuPy (pip install 'pagedgen[cuda]')",
    ),
]


@pytest.mark.parametrize("head_size", HEAD_SIZES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_attention(dtype: torch.dtype, block_size: int, head_size: int) -> None:
    case = make_prefill_case(dtype, 8, 2, head_size, block_size, device="cuda")
    check_prefill(loader.launch, case)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(8, 8), (8, 2), (12, 4), (14, 2)])
def test_prefill_gqa(num_heads: int, num_kv_heads: int) -> None:
    case = make_prefill_case(torch.float16, num_heads, num_kv_heads, 128, 16, device="cuda")
    check_prefill(loader.launch, case)


@pytest.mark.parametrize(("window", "softcap"), [(64, None), (None, 50.0), (300, 30.0)])
def test_prefill_window_softcap(window: int | None, softcap: float | None) -> None:
    seqs = ((700, 700), (129, 1000), (1, 513))
    case = make_prefill_case(
        torch.bfloat16, 8, 4, 256, 16, seqs, window=window, softcap=softcap, device="cuda"
    )
    check_prefill(loader.launch, case)


@pytest.mark.parametrize("window", [None, 128])
def test_prefill_sinks(window: int | None) -> None:
    """gpt-oss's shape: heads of 64, GQA 8:1, sinks, its 128-token window."""
    seqs = ((700, 700), (129, 1000), (1, 513))
    case = make_prefill_case(
        torch.bfloat16, 64, 8, 64, 16, seqs, window=window, sinks=True, device="cuda"
    )
    check_prefill(loader.launch, case)


@pytest.mark.parametrize(
    ("window", "softcap", "sinks"), [(None, None, False), (300, 30.0, False), (None, None, True)]
)
def test_prefill_alibi(window: int | None, softcap: float | None, sinks: bool) -> None:
    """BLOOM's shape (MHA, heads of 64) and slopes: alone, windowed under a soft cap, with sinks
    (which pin the bias's origin)."""
    seqs = ((700, 700), (129, 1000), (1, 513))
    case = make_prefill_case(
        torch.bfloat16, 16, 16, 64, 16, seqs, window=window, softcap=softcap, sinks=sinks,
        alibi=True, device="cuda",
    )  # fmt: skip
    check_prefill(loader.launch, case)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_long_prompts(dtype: torch.dtype) -> None:
    """Whole prompts of thousands of tokens and a chunk after a long cached prefix."""
    seqs = ((2048, 2048), (1000, 4097), (3, 3000), (517, 517))
    case = make_prefill_case(dtype, 32, 8, 128, 16, seqs, device="cuda")
    check_prefill(loader.launch, case)
