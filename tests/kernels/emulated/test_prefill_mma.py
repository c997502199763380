"""kernels/prefill_attention_mma.cu run on the CPU through cuda_emu.h, against the torch
reference: prefill_attention.cu's semantics on mma.sync tiles of 64 packed rows, K/V streamed
through shared memory by cp.async, under both of the emulator's schedules (Emulator.set_racing).

Each case, unless it says otherwise, is prefill_cases.SEQS: whole prompts of one token, of less
than a tile and of several, ending in partial blocks, and chunks after a cached prefix.
"""

from collections.abc import Callable

import pytest
import torch

from pagedgen.kernels import paged_attention_mma
from pagedgen.kernels.launch import KernelLaunch
from pagedgen.kernels.prefill_attention import mma_shared_bytes, prefill_attention_launch
from tests.kernels.emulator import EmulationError, have_gxx, module_emulator
from tests.kernels.prefill_cases import check_prefill, make_prefill_case, run_prefill

pytestmark = pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation")

Launch = Callable[[KernelLaunch], None]


@pytest.fixture(params=["in-step", "racing"])
def launch(request) -> Launch:
    racing = request.param == "racing"

    def emulate(kernel_launch: KernelLaunch) -> None:
        assert kernel_launch.module.source == "prefill_attention_mma.cu", kernel_launch.module
        emulator = module_emulator(kernel_launch.module)
        emulator.set_racing(racing)
        emulator.launch(kernel_launch)

    return emulate


@pytest.mark.parametrize("head_size", paged_attention_mma.HEAD_SIZES)
@pytest.mark.parametrize("dtype", paged_attention_mma.DTYPES, ids=str)
def test_dtypes_and_head_sizes(launch: Launch, dtype: torch.dtype, head_size: int) -> None:
    case = make_prefill_case(dtype, 8, 2, head_size, 16, seed=head_size)
    check_prefill(launch, case, tensor_cores=True)


@pytest.mark.parametrize("block_size", [8, 32])
def test_block_sizes(launch: Launch, block_size: int) -> None:
    case = make_prefill_case(torch.bfloat16, 4, 1, 64, block_size, seed=block_size)
    check_prefill(launch, case, tensor_cores=True)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 2), (9, 3), (32, 8)])
def test_gqa(launch: Launch, num_heads: int, num_kv_heads: int) -> None:
    """No grouping, 3:1 (tiles straddle a token's heads), SmolLM2's 3:1, Llama-3's 4:1."""
    case = make_prefill_case(torch.float16, num_heads, num_kv_heads, 64, 16, seed=num_heads)
    check_prefill(launch, case, tensor_cores=True)


def test_long_prompt_and_long_cached_prefix(launch: Launch) -> None:
    """Many key tiles: the running max rescales many times; row tiles past the first."""
    case = make_prefill_case(torch.bfloat16, 8, 2, 128, 16, seqs=((150, 150), (5, 300), (40, 180)))
    check_prefill(launch, case, tensor_cores=True)


@pytest.mark.parametrize("window", [1, 20, 70])
def test_sliding_window(launch: Launch, window: int) -> None:
    case = make_prefill_case(torch.float16, 4, 2, 64, 16, window=window, seed=window)
    check_prefill(launch, case, tensor_cores=True)


def test_softcap_sinks_and_alibi(launch: Launch) -> None:
    for options in ({"softcap": 5.0, "window": 30}, {"sinks": True}, {"alibi": True}):
        case = make_prefill_case(torch.bfloat16, 4, 2, 64, 16, **options)
        check_prefill(launch, case, tensor_cores=True)


def test_strided_query_rows(launch: Launch) -> None:
    case = make_prefill_case(torch.float16, 4, 2, 64, 16, seed=3)
    qkv = torch.randn(case.query.shape[0], 8, 64).half()
    qkv[:, :4] = case.query
    out = run_prefill(launch, case, query=qkv[:, :4], tensor_cores=True)
    expected = run_prefill(launch, case, tensor_cores=True)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_launch_plan(launch: Launch) -> None:
    case = make_prefill_case(torch.float16, 32, 8, 128, 16, seqs=((70, 70), (3, 40)))
    out = torch.empty_like(case.query)
    args = (out, *case[:6], 70, case.scale)
    kernel_launch = prefill_attention_launch(*args, tensor_cores=True)
    assert kernel_launch.grid == (8, -(-70 * 4 // 64), 2)
    assert kernel_launch.shared_mem == mma_shared_bytes(128) == 80 * 1024
    with pytest.raises(EmulationError, match="dynamic shared memory"):
        launch(kernel_launch._replace(shared_mem=kernel_launch.shared_mem - 16))
    fp8 = case._replace(
        key_cache=case.key_cache.to(torch.float8_e4m3fn),
        value_cache=case.value_cache.to(torch.float8_e4m3fn),
    )
    plain = prefill_attention_launch(out, *fp8[:6], 70, case.scale, tensor_cores=True)
    assert plain.module.source == "prefill_attention.cu"
