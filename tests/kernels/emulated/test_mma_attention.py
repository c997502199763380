"""kernels/paged_attention_mma.cu run on the CPU through cuda_emu.h, against the torch reference:
tiles of up to 16 query heads of a kv head on mma.sync, K/V streamed through shared memory by
cp.async. Every test runs under both of the emulator's schedules (Emulator.set_racing), the two
ends of what a GPU may do; dynamic shared memory starts as NaN.

Each case is make_decode_case's batch over scattered blocks in a NaN-poisoned cache, with context
lengths on both sides of the 64-token stages and the 16-token warp slices; v2 runs with 64- and
128-token partitions, and the reduce is paged_attention.cu's.
"""

from collections.abc import Callable

import pytest
import torch

from pagedgen.kernels import paged_attention_mma as mma
from pagedgen.kernels.launch import KernelLaunch
from pagedgen.kernels.paged_attention import paged_attention_launches
from tests.kernels.emulator import EmulationError, have_gxx, module_emulator
from tests.kernels.paged_cases import check_decode, decode_launches, make_decode_case

pytestmark = pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation")

CONTEXT_LENS = (1, 15, 16, 63, 64, 65, 100, 257)


Launch = Callable[[KernelLaunch], None]


@pytest.fixture(params=["in-step", "racing"])
def launch(request) -> Launch:
    racing = request.param == "racing"

    def emulate(kernel_launch: KernelLaunch) -> None:
        emulator = module_emulator(kernel_launch.module)
        emulator.set_racing(racing)
        emulator.launch(kernel_launch)

    return emulate


def check_all(launch: Launch, case) -> None:
    assert planned_source(case) == "paged_attention_mma.cu"
    check_decode(launch, case, version=1, tensor_cores=True)
    for partition_size in (64, 128):
        check_decode(launch, case, 2, partition_size=partition_size, tensor_cores=True)


def planned_source(case, **options) -> str:
    out = torch.empty_like(case.query)
    launches = decode_launches(case, out, None, None, tensor_cores=True, **options)
    return launches[0].module.source


@pytest.mark.parametrize("head_size", mma.HEAD_SIZES)
@pytest.mark.parametrize("dtype", mma.DTYPES, ids=str)
def test_head_sizes(launch: Launch, dtype: torch.dtype, head_size: int) -> None:
    case = make_decode_case(dtype, 8, 2, head_size, 16, CONTEXT_LENS, seed=head_size)
    check_all(launch, case)


@pytest.mark.parametrize("block_size", [8, 32])
def test_block_sizes(launch: Launch, block_size: int) -> None:
    case = make_decode_case(torch.float16, 8, 2, 128, block_size, CONTEXT_LENS, seed=block_size)
    check_all(launch, case)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads"),
    [
        (4, 4),  # MHA: a tile of one head
        (9, 3),  # SmolLM2
        (32, 8),  # Llama-3-8B
        (16, 1),  # one full tile
        (40, 2),  # groups of 20: tiles of 16 and 4
    ],
    ids=str,
)
def test_gqa_ratios(launch: Launch, num_heads: int, num_kv_heads: int) -> None:
    case = make_decode_case(
        torch.bfloat16, num_heads, num_kv_heads, 64, 16, (1, 17, 64, 130), seed=num_heads
    )
    check_all(launch, case)


def test_grid_has_a_block_per_tile_of_16_heads() -> None:
    case = make_decode_case(torch.float16, 40, 2, 64, 16, (5, 9))
    launches = decode_launches(case, torch.empty_like(case.query), 1, None, tensor_cores=True)
    assert launches[0].grid == (2 * 2, 2, 1)  # groups of 20: tiles of 16 and 4
    assert launches[0].block == (mma.NUM_THREADS, 1, 1)
    assert launches[0].shared_mem == mma.shared_bytes(64)


def test_strided_query_rows(launch: Launch) -> None:
    """Queries as the q part of a fused qkv projection: rows longer than the heads they hold."""
    case = make_decode_case(torch.bfloat16, 8, 2, 64, 16, (3, 70, 200), seed=4)
    qkv = torch.randn(3, 12, 64).to(torch.bfloat16)
    qkv[:, :8] = case.query
    strided = case._replace(query=qkv[:, :8])
    assert not strided.query.is_contiguous()
    check_decode(launch, strided, version=1, tensor_cores=True)


@pytest.mark.parametrize(
    ("dtype", "cache_dtype", "head_size"),
    [
        (torch.float32, None, 64),
        (torch.float16, torch.float8_e4m3fn, 64),
        (torch.float16, None, 80),
    ],
    ids=["float32", "fp8-cache", "head-80"],
)
def test_layers_it_declines_keep_the_other_kernels(dtype, cache_dtype, head_size) -> None:
    case = make_decode_case(dtype, 4, 2, head_size, 16, (5, 40), cache_dtype=cache_dtype)
    assert planned_source(case, grouped=True) != "paged_attention_mma.cu"


@pytest.mark.parametrize(
    "options",
    [
        {"window": 20},
        {"window": 100},  # partitions wholly before it, one it starts in
        {"softcap": 5.0},
        {"sinks": True},
        {"alibi": True},
        {"window": 70, "softcap": 5.0, "sinks": True, "alibi": True},
    ],
    ids=["window-20", "window-100", "softcap", "sinks", "alibi", "all"],
)
def test_windows_soft_caps_sinks_and_alibi(launch: Launch, options: dict) -> None:
    case = make_decode_case(torch.bfloat16, 8, 2, 64, 16, CONTEXT_LENS, seed=5, **options)
    check_all(launch, case)


def test_the_launch_must_give_the_shared_memory_the_kernel_uses(launch: Launch) -> None:
    case = make_decode_case(torch.float16, 4, 2, 64, 16, (5, 40))
    out = torch.empty_like(case.query)
    (kernel_launch,) = decode_launches(case, out, 1, None, tensor_cores=True)
    with pytest.raises(EmulationError, match="dynamic shared memory"):
        launch(kernel_launch._replace(shared_mem=kernel_launch.shared_mem - 16))


def test_planner_partitions_a_single_long_sequence_over_the_gpu(launch: Launch) -> None:
    # Llama-3-8B: 8 kv heads, one tile each; 132 SMs hold 264 blocks of heads of 128.
    assert mma.mma_partition_size(4096, 8, 128, 132) == 64
    assert mma.mma_partition_size(4096, 16, 128, 132) == 128
    assert mma.mma_partition_size(512, 8 * 256, 128, 132) is None  # the batch fills the GPU
    assert mma.mma_partition_size(20000, 8 * 256, 128, 132) == 512  # past vLLM's v1 bound
    assert mma.mma_partition_size(40, 8, 128, 132) is None  # one partition covers it
    case = make_decode_case(torch.float16, 8, 2, 64, 16, (1000,))
    launches = paged_attention_launches(
        torch.empty_like(case.query), *case[:5], 1000, case.scale, tensor_cores=True
    )
    assert [kernel.grid[2] for kernel in launches] == [16]  # 64-token partitions, no reduce
    check_decode(launch, case, version=None, tensor_cores=True)


def test_v2_leaves_its_counters_at_zero(launch: Launch) -> None:
    """The last partition of each tile resets its count, so the next launch (or graph replay)
    starts from zeros."""
    case = make_decode_case(torch.bfloat16, 40, 2, 64, 16, (1, 64, 65, 300), seed=9)
    counters = mma.counters(torch.device("cpu"), 1)
    for _ in range(2):
        check_decode(launch, case, 2, partition_size=64, tensor_cores=True)
        assert not counters.any()


def test_gpus_short_of_shared_memory_or_sm_80_keep_the_other_kernels(monkeypatch) -> None:
    from pagedgen.kernels import loader
    from pagedgen.kernels.prefill_attention import mma_shared_bytes

    capability = (8, 9)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    monkeypatch.setattr(loader, "max_dynamic_shared_memory", lambda index: 99 * 1024)  # sm_89
    cuda, half = torch.device("cuda", 0), torch.float16
    assert not mma.supports(half, half, 128, cuda, mma.shared_bytes(128))  # decode: 100 KB
    assert mma.supports(half, half, 64, cuda, mma.shared_bytes(64))
    assert mma.supports(half, half, 256, cuda, mma_shared_bytes(256))  # prefill: 96 KB
    capability = (7, 5)
    assert not mma.supports(half, half, 64, cuda, mma.shared_bytes(64))


def test_more_partitions_than_lanes(launch: Launch) -> None:
    """40 partitions: the combining warp's lanes take partitions 0-31, then 32-39, and its
    output sums them 8 at a time; under a window of 700 tokens, from partition 28 (of 39 at
    2,470 tokens) on, the last group of 8 running past the end, and 23 of 35 at 2,200."""
    case = make_decode_case(torch.bfloat16, 8, 2, 64, 16, (2500, 70), seed=11)
    check_decode(launch, case, 2, partition_size=64, tensor_cores=True)
    case = make_decode_case(torch.bfloat16, 8, 2, 64, 16, (2470, 2200, 70), seed=12, window=700)
    check_decode(launch, case, 2, partition_size=64, tensor_cores=True)


def test_v1_takes_sequences_in_the_order_given(launch: Launch) -> None:
    """seq_order only says which sequence each row of blocks attends for: longest first, or any
    permutation, each sequence's output lands in its own row. The planner checks its shape."""
    lens = (5, 300, 64, 130, 1, 257)
    case = make_decode_case(torch.bfloat16, 8, 2, 64, 16, lens, seed=13, window=100, sinks=True)
    for order in (sorted(range(6), key=lambda i: -lens[i]), [3, 0, 5, 1, 4, 2]):
        seq_order = torch.tensor(order, dtype=torch.int32)
        check_decode(launch, case, 1, tensor_cores=True, seq_order=seq_order)
    with pytest.raises(ValueError, match="seq_order"):
        decode_launches(
            case, torch.empty_like(case.query), 1, None, tensor_cores=True,
            seq_order=torch.arange(5, dtype=torch.int32),
        )  # fmt: skip
