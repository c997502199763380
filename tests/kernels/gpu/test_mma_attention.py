"""The tensor-core decode kernels (kernels/paged_attention_mma.cu) on a real GPU: against the torch
reference and against the per-head kernel, with the planner's own v1/v2 choice and forced
versions. Skipped without a CUDA GPU of compute capability 8.0 or newer and CuPy (older GPUs
fall back to the other kernels, which test_gpu.py covers)."""

import itertools

import pytest
import torch

from pagedgen.kernels import loader
from pagedgen.kernels import paged_attention_mma as mma
from tests.kernels.paged_cases import (
    TOLERANCES,
    DecodeCase,
    backend_decode_kernels,
    check_decode,
    decode_launches,
    make_decode_case,
    requires_gpu,
    run_decode,
)

pytestmark = requires_gpu(mma.MIN_COMPUTE_CAPABILITY)

DTYPES = (torch.float16, torch.bfloat16)
# Groups of 3 (a tile of 3 of 16 heads), 4, 1 (MHA: a tile of one head) and 20 (tiles of 16
# and 4).
GQA_RATIOS = [(9, 3), (32, 8), (8, 8), (40, 2)]
BLOCK_SIZES = (8, 16, 32)
# Every head size with every GQA ratio, the block sizes in turn: each ratio meets each block size
# and each head size each block size, without the whole cross product.
SHAPES = [
    (head_size, block_size, ratio)
    for (head_size, ratio), block_size in zip(
        itertools.product(mma.HEAD_SIZES, GQA_RATIOS), itertools.cycle(BLOCK_SIZES)
    )
]


def assert_mma_plan(case: DecodeCase, version: int | None, partition_size: int | None) -> None:
    """The planner takes the tensor-core kernel for the case, with its shared memory."""
    out = torch.empty_like(case.query)
    launches = decode_launches(case, out, version, partition_size, tensor_cores=True)
    names = [launch.name_expression for launch in launches]
    assert "_mma_" in names[0], names
    assert launches[0].shared_mem == mma.shared_bytes(case.query.shape[-1])


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(("head_size", "block_size", "ratio"), SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mma_matches_reference(
    dtype: torch.dtype,
    head_size: int,
    block_size: int,
    ratio: tuple[int, int],
    version: int,
) -> None:
    num_heads, num_kv_heads = ratio
    case = make_decode_case(dtype, num_heads, num_kv_heads, head_size, block_size, device="cuda")
    assert_mma_plan(case, version, 64)
    check_decode(loader.launch, case, version, partition_size=64, tensor_cores=True)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), GQA_RATIOS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mma_long_contexts(dtype: torch.dtype, num_heads: int, num_kv_heads: int) -> None:
    """The planner's own plan and partitions (a single sequence gets small ones), and forced v1
    and v2 (partitions of 512)."""
    contexts = (600, 1500, 4097)
    for context_lens in (contexts, contexts[-1:]):
        case = make_decode_case(
            dtype, num_heads, num_kv_heads, 128, 16, context_lens=context_lens, device="cuda"
        )
        assert_mma_plan(case, None, None)
        check_decode(loader.launch, case, None, partition_size=None, tensor_cores=True)
        check_decode(loader.launch, case, version=1, tensor_cores=True)
        check_decode(loader.launch, case, version=2, tensor_cores=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mma_matches_per_head_kernel(dtype: torch.dtype) -> None:
    """Both kernels read the same rounded inputs and sum in float32 (the mma kernel rounds the
    softmax weights to the dtype before P V): they agree within the output's rounding, at every
    planner choice."""
    shapes = ((32, 8, 128), (9, 3, 64))
    for (num_heads, num_kv_heads, head_size), context_lens in itertools.product(
        shapes, ((1, 17, 100, 257, 3000), (8000,))
    ):
        case = make_decode_case(
            dtype, num_heads, num_kv_heads, head_size, 16, context_lens=context_lens, device="cuda"
        )
        tensor_cores = run_decode(loader.launch, case, None, None, tensor_cores=True)
        per_head = run_decode(loader.launch, case, version=None)
        tolerance = TOLERANCES[dtype]
        torch.testing.assert_close(tensor_cores, per_head, atol=tolerance, rtol=tolerance)


def test_backend_decodes_with_the_mma_kernel(monkeypatch) -> None:
    """tensor_core_decode=True reaches the launch plan."""
    names = backend_decode_kernels(monkeypatch, "tensor_core_decode")
    assert any("mma" in name for name in names), names


@pytest.mark.parametrize(
    "options",
    [{"window": 300}, {"softcap": 30.0}, {"sinks": True}, {"alibi": True}],
    ids=["window", "softcap", "sinks", "alibi"],
)
def test_mma_options(options: dict) -> None:
    """Mistral's windows, Gemma 2's soft cap, gpt-oss's sinks, BLOOM's ALiBi, over partitions."""
    context_lens = (1, 17, 100, 600, 1500, 4097)
    case = make_decode_case(torch.bfloat16, 8, 2, 128, 16, context_lens, device="cuda", **options)
    check_decode(loader.launch, case, None, partition_size=None, tensor_cores=True)
    check_decode(loader.launch, case, 2, partition_size=64, tensor_cores=True)
