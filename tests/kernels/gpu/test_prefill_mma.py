"""The tensor-core prefill kernel (kernels/prefill_attention_mma.cu) on a real GPU against the
torch reference, on the shapes of test_gpu_prefill.py that it takes. Skipped without a CUDA GPU
(sm_80 or newer) and CuPy."""

import pytest
import torch

from pagedgen.kernels import loader, paged_attention_mma
from pagedgen.kernels.attention_args import BLOCK_SIZES
from pagedgen.kernels.prefill_attention import prefill_attention_launch
from tests.kernels.paged_cases import requires_gpu
from tests.kernels.prefill_cases import check_prefill, make_prefill_case, run_prefill

pytestmark = requires_gpu(paged_attention_mma.MIN_COMPUTE_CAPABILITY)
LONG_SEQS = ((700, 700), (129, 1000), (1, 513))


def check(case) -> None:
    out = torch.empty_like(case.query)
    plan = prefill_attention_launch(
        out, *case[:6], max(case.query_lens), case.scale, tensor_cores=True
    )
    assert plan.module.source == "prefill_attention_mma.cu"
    check_prefill(loader.launch, case, tensor_cores=True)


@pytest.mark.parametrize("head_size", paged_attention_mma.HEAD_SIZES)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("dtype", paged_attention_mma.DTYPES, ids=str)
def test_prefill_mma(dtype: torch.dtype, block_size: int, head_size: int) -> None:
    check(make_prefill_case(dtype, 8, 2, head_size, block_size, device="cuda"))


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(8, 8), (9, 3), (12, 4), (32, 8)])
def test_prefill_mma_gqa(num_heads: int, num_kv_heads: int) -> None:
    check(make_prefill_case(torch.float16, num_heads, num_kv_heads, 128, 16, device="cuda"))


@pytest.mark.parametrize(("window", "softcap"), [(64, None), (None, 50.0), (300, 30.0)])
def test_prefill_mma_window_softcap(window: int | None, softcap: float | None) -> None:
    case = make_prefill_case(
        torch.bfloat16, 8, 4, 256, 16, LONG_SEQS, window=window, softcap=softcap, device="cuda"
    )
    check(case)


@pytest.mark.parametrize("window", [None, 128])
def test_prefill_mma_sinks_and_alibi(window: int | None) -> None:
    """gpt-oss's shape with sinks and its window; BLOOM's (MHA, heads of 64) with ALiBi."""
    check(
        make_prefill_case(
            torch.bfloat16, 64, 8, 64, 16, LONG_SEQS, window=window, sinks=True, device="cuda"
        )
    )
    check(
        make_prefill_case(
            torch.bfloat16, 16, 16, 64, 16, LONG_SEQS, window=window, alibi=True, device="cuda"
        )
    )


@pytest.mark.parametrize("dtype", paged_attention_mma.DTYPES, ids=str)
def test_prefill_mma_long_prompts_match_the_plain_kernel(dtype: torch.dtype) -> None:
    """Whole prompts of thousands of tokens and a chunk after a long cached prefix: against the
    reference, and within the output's rounding of prefill_attention.cu."""
    seqs = ((2048, 2048), (1000, 4097), (3, 3000), (517, 517))
    case = make_prefill_case(dtype, 32, 8, 128, 16, seqs, device="cuda")
    check(case)
    tensor_cores = run_prefill(loader.launch, case, tensor_cores=True)
    plain = run_prefill(loader.launch, case)
    tolerance = 2e-3 if dtype == torch.float16 else 1.6e-2
    torch.testing.assert_close(tensor_cores, plain, atol=tolerance, rtol=tolerance)
