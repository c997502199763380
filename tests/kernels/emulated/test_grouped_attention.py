"""kernels/paged_attention_grouped.cu run on the CPU through cuda_emu.h, against the torch
reference: one thread block per (kv head, sequence[, partition]) for a tile of its GQA group.

Each case is make_decode_case's batch (context lengths 1, 15, 16, 17, 100, 257 unless a test
says otherwise) over scattered blocks in a NaN-poisoned cache; v2 runs with 64-token partitions,
so the longer contexts span several, and the reduce is paged_attention.cu's.
"""

from collections.abc import Callable

import pytest
import torch

from pagedgen.kernels.attention_args import HEAD_SIZES
from pagedgen.kernels.launch import KernelLaunch
from pagedgen.kernels.paged_attention import paged_attention_launches
from pagedgen.kernels.paged_attention_grouped import (
    group_tile,
    grouped_module,
    grouped_partition_size,
)
from pagedgen.kernels.source import kernel_source
from tests.kernels.emulator import Emulator
from tests.kernels.paged_cases import DTYPES, SMALL_PARTITION_SIZE, check_decode, make_decode_case

# (dtype, head_size, block_size, group tile) of every module the tests below launch: the emulator
# builds just these, one library for all.
EMULATED = {
    *((dtype, head_size, 16, 4) for dtype in DTYPES for head_size in HEAD_SIZES),
    *((torch.float16, 128, block_size, tile) for block_size in (8, 32) for tile in (4, 8)),
    (torch.float32, 64, 16, 8),
}


@pytest.fixture(scope="module")
def grouped_launch(attention_emulator) -> Callable[[KernelLaunch], None]:
    """Launches grouped kernels on their emulator, the v2 reduce on paged_attention.cu's."""
    modules = [grouped_module(*key) for key in sorted(EMULATED, key=str)]
    names = sorted({name for module in modules for name in module.name_expressions})
    grouped = Emulator(kernel_source("paged_attention_grouped.cu"), names, modules[0].defines)

    def launch(kernel_launch: KernelLaunch) -> None:
        if kernel_launch.module.source == "paged_attention_grouped.cu":
            grouped.launch(kernel_launch)
        else:
            attention_emulator.launch(kernel_launch)

    return launch


def check_both(launch: Callable[[KernelLaunch], None], case) -> None:
    check_decode(launch, case, version=1, grouped=True)
    check_decode(launch, case, version=2, partition_size=SMALL_PARTITION_SIZE, grouped=True)


@pytest.mark.parametrize("head_size", HEAD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_head_sizes(grouped_launch, dtype: torch.dtype, head_size: int) -> None:
    case = make_decode_case(dtype, 3, 1, head_size, 16, seed=head_size)
    check_both(grouped_launch, case)


@pytest.mark.parametrize("block_size", [8, 32])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(8, 2), (8, 1)], ids=str)
def test_block_sizes(grouped_launch, num_heads: int, num_kv_heads: int, block_size: int) -> None:
    case = make_decode_case(torch.float16, num_heads, num_kv_heads, 128, block_size, seed=7)
    check_both(grouped_launch, case)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "context_lens"),
    [
        (9, 3, (1, 15, 16, 17, 100, 257)),  # SmolLM2: groups of 3 in tiles of 4
        (8, 1, (1, 15, 16, 17, 100, 257)),  # one tile of 8
        (12, 1, (1, 17, 257)),  # tiles of 8 and 4
        (32, 8, (1, 17, 100)),  # Llama-3-8B
    ],
    ids=str,
)
def test_gqa_ratios(grouped_launch, num_heads: int, num_kv_heads: int, context_lens) -> None:
    case = make_decode_case(torch.float32, num_heads, num_kv_heads, 64, 16, context_lens, seed=3)
    check_both(grouped_launch, case)


def test_head_size_256_splits_groups_of_8(grouped_launch) -> None:
    case = make_decode_case(torch.bfloat16, 8, 1, 256, 16, context_lens=(1, 17, 257))
    launches = paged_attention_launches(
        torch.empty_like(case.query), *case[:5], case.max_context_len, case.scale, grouped=True
    )
    assert launches[0].grid[0] == 2  # two tiles of 4 heads
    check_both(grouped_launch, case)


def test_mha_keeps_the_per_head_kernel() -> None:
    case = make_decode_case(torch.float32, 4, 4, 64, 16)
    args = (torch.empty_like(case.query), *case[:5], case.max_context_len, case.scale)
    grouped = paged_attention_launches(*args, grouped=True)
    assert [launch.name_expression for launch in grouped] == [
        launch.name_expression for launch in paged_attention_launches(*args)
    ]


def test_plan_grid_and_arguments() -> None:
    case = make_decode_case(torch.float16, 32, 8, 128, 16, context_lens=(600, 30))
    args = (torch.empty_like(case.query), *case[:5], 600, case.scale)
    v1 = paged_attention_launches(*args, version=1, grouped=True)
    assert v1[0].grid == (8, 2, 1) and "grouped_v1_kernel" in v1[0].name_expression
    v2 = paged_attention_launches(*args, version=2, partition_size=128, grouped=True)
    assert v2[0].grid == (8, 2, 5) and int(v2[0].args[-1]) == 128  # partition size
    assert v2[1].grid == (32, 2, 1) and "reduce_kernel" in v2[1].name_expression
    assert "128, 16, 128, 4>" in v2[0].name_expression  # head, block, threads, tile


def test_group_tiles() -> None:
    assert [group_tile(group, 128) for group in (2, 3, 4, 5, 8, 16)] == [4, 4, 4, 8, 8, 8]
    assert group_tile(8, 256) == 4


@pytest.mark.parametrize(
    ("num_seqs", "context_len", "num_work_blocks", "expected"),
    [
        (256, 512, 256 * 8, None),  # 2048 (kv head, sequence) blocks fill 132 SMs
        (64, 1024, 64 * 8, 512),  # 512 blocks do not; 1024 partitions of 512 do
        (16, 2048, 16 * 8, 256),
        (1, 4096, 8, 64),  # a single sequence: as many partitions as it takes, down to 64
        (32, 8192, 32 * 8, 512),
        (64, 1024, 64 * 3, 256),  # SmolLM2: 3 kv heads
        (1, 40, 8, None),  # within one partition
        (1024, 16384, 1024 * 8, 512),  # beyond 8192 tokens always partitions
    ],
)
def test_partition_rule(num_seqs: int, context_len: int, num_work_blocks: int, expected) -> None:
    assert grouped_partition_size(context_len, num_work_blocks, 16, 132) == expected


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_size", "grouped"),
    [
        (32, 8, 128, True),  # Llama-3-8B: measured 1.4-2.0x the per-head kernel
        (16, 2, 256, True),
        (9, 3, 64, False),  # SmolLM2: measured 0.63x
        (8, 2, 64, False),
        (4, 2, 128, False),  # groups of 2: half of each tile idle
        (8, 8, 128, False),  # no GQA
    ],
    ids=str,
)
def test_unset_grouped_takes_the_kernel_where_it_measured_faster(
    num_heads: int, num_kv_heads: int, head_size: int, grouped: bool
) -> None:
    case = make_decode_case(torch.bfloat16, num_heads, num_kv_heads, head_size, 16, (40,))
    args = (torch.empty_like(case.query), *case[:5], case.max_context_len, case.scale)
    [launch] = paged_attention_launches(*args, version=1, grouped=None)
    assert ("grouped" in launch.name_expression) == grouped
    windowed = paged_attention_launches(*args, version=1, grouped=None, window=8)
    assert "grouped" not in windowed[0].name_expression  # it declines windows whatever is asked
