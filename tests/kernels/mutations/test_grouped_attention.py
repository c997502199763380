"""The grouped decode kernel's emulation checks must catch typical bugs: each mutation below is
planted into a copy of kernels/paged_attention_grouped.cu, built for the CPU, and the checks of
test_emulated_grouped_attention.py must fail on it. Bugs that write out of bounds (a tile's heads
past num_heads) are left out: the emulator runs in this process and would corrupt it."""

import pytest
import torch

from pagedgen.kernels.paged_attention_grouped import grouped_module
from pagedgen.kernels.source import kernel_source
from tests.kernels.emulator import EmulationError, Emulator, have_gxx
from tests.kernels.mutations.test_paged_attention import mutate
from tests.kernels.paged_cases import SMALL_PARTITION_SIZE, check_decode, make_decode_case

pytestmark = [
    pytest.mark.slow,  # each mutation builds its own copy of a kernel
    pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation"),
]

# name: (original text, planted bug, how often the text occurs)
MUTATIONS = {
    "every_head_reads_the_first_query": (
        "to_float(q[g * HEAD_SIZE + d + e])",
        "to_float(q[d + e])",
        1,
    ),
    "output_row_of_the_kv_head": (
        "out + ((long long)seq * num_heads + tile.first_head) * HEAD_SIZE",
        "out + ((long long)seq * num_heads + tile.kv_head) * HEAD_SIZE",
        1,
    ),
    "kv_head_offset_dropped": (
        "BLOCK_SIZE * token_stride + kv_head * HEAD_SIZE;",
        "BLOCK_SIZE * token_stride;",
        1,
    ),
    "value_slices_share_the_first_head": (
        "const int first_slice_head = v_slice * SLICE_HEADS;",
        "const int first_slice_head = 0;",
        1,
    ),
    "missing_acc_rescale": (
        "for (int e = 0; e < VEC; ++e) acc[h][i][e] *= alpha;",
        "for (int e = 0; e < VEC; ++e) acc[h][i][e] *= 1.f;",
        1,
    ),
    "missing_sum_rescale": (
        "s_l[warp][lane] * s_alpha[warp][lane] + block_sum",
        "s_l[warp][lane] + block_sum",
        1,
    ),
    "last_block_dropped": (
        "const int end_block = (end_token + BLOCK_SIZE - 1) / BLOCK_SIZE;",
        "const int end_block = end_token / BLOCK_SIZE;",
        1,
    ),
    "partition_stats_rows_adjacent": ("exp_sums + row, gridDim.z,", "exp_sums + row, 1,", 1),
    "partition_outputs_rows_adjacent": (
        "tmp_out + row * HEAD_SIZE, (long long)gridDim.z * HEAD_SIZE,",
        "tmp_out + row * HEAD_SIZE, HEAD_SIZE,",
        1,
    ),
    "missing_syncwarp_after_scores": (
        "    }\n    __syncwarp();\n    if (lane < GROUP_TILE)",
        "    }\n    if (lane < GROUP_TILE)",
        1,
    ),
}


def grouped_checks_pass(source: str, attention_emulator: Emulator) -> bool:
    """v1 and v2 on full tiles of 4 (float32, head 64: two value slices per warp); a partial
    tile's missing head would hide a bug in the last head's shared-memory traffic."""
    module = grouped_module(torch.float32, 64, 16, 4)
    emulator = Emulator(source, list(module.name_expressions), module.defines)

    def launch(kernel_launch) -> None:
        grouped = kernel_launch.module.source == "paged_attention_grouped.cu"
        (emulator if grouped else attention_emulator).launch(kernel_launch)

    case = make_decode_case(torch.float32, 8, 2, 64, 16, context_lens=(1, 17, 100, 257))
    try:
        check_decode(launch, case, version=1, grouped=True)
        check_decode(launch, case, 2, partition_size=SMALL_PARTITION_SIZE, grouped=True)
    except (AssertionError, EmulationError):
        return False
    return True


def test_original_passes(attention_emulator) -> None:
    assert grouped_checks_pass(kernel_source("paged_attention_grouped.cu"), attention_emulator)


@pytest.mark.parametrize("name", MUTATIONS)
def test_mutation_is_caught(attention_emulator, name: str) -> None:
    source = mutate(kernel_source("paged_attention_grouped.cu"), *MUTATIONS[name])
    assert not grouped_checks_pass(source, attention_emulator), f"the tests miss the bug {name!r}"
