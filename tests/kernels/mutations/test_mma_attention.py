"""The tensor-core decode kernel's emulation checks must catch typical bugs: each mutation below is
planted into a copy of kernels/paged_attention_mma.cu (its headers inlined), built for the CPU,
and the checks of test_emulated_mma_attention.py must fail on it. Among them are the bugs a GPU
shows only sometimes (a missing wait or barrier), which the emulator shows every time."""

import itertools

import pytest
import torch

from pagedgen.kernels import paged_attention_mma as mma
from pagedgen.kernels.paged_attention_mma import mma_module
from pagedgen.kernels.source import kernel_source
from tests.kernels.emulator import EmulationError, Emulator, have_gxx, module_emulator
from tests.kernels.mutations.test_paged_attention import mutate
from tests.kernels.paged_cases import check_decode, make_decode_case

pytestmark = [
    pytest.mark.slow,  # each mutation builds its own copy of a kernel
    pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation"),
]

# name: (original text, planted bug, how often the text occurs)
MUTATIONS = {
    "no_wait_for_the_chunk": (
        "cp_async_wait<kStages - 2>();",
        "cp_async_wait<kStages - 1>();",
        1,
    ),
    "no_barrier_after_the_wait": (
        "    __syncthreads();               // everyone's have",
        "    // everyone's have",
        1,
    ),
    "refill_before_the_barrier": (
        "    __syncthreads();               // everyone's have, and chunk - 1's stage is read: "
        "refill it\n    load_chunk(chunk + kStages - 1, next_blocks);",
        "    load_chunk(chunk + kStages - 1, next_blocks);\n    __syncthreads();",
        1,
    ),
    "copies_not_swizzled": (
        "const int slot = swizzled_piece<kRow>(stage_row + row, piece);",
        "const int slot = (stage_row + row) * kRow + piece;",
        1,
    ),
    "tokens_past_the_end_copied": (
        "cp_async_16(&s_v[slot], v_head + offset, valid);",
        "cp_async_16(&s_v[slot], v_head + offset, true);",
        1,
    ),
    "rows_copy_the_chunks_first_block": (
        "__shfl_sync(kFullMask, blocks, row / BLOCK_SIZE)",
        "__shfl_sync(kFullMask, blocks, 0)",
        1,
    ),
    "block_numbers_of_the_chunk_before": (
        "next_blocks = chunk_blocks(chunk + kStages);",
        "next_blocks = chunk_blocks(chunk + kStages - 1);",
        1,
    ),
    "tokens_past_the_end_scored": (
        "s[n][i] = token >= options.visible_from && token < end_token ? score : kNegMax;",
        "s[n][i] = token >= options.visible_from ? score : kNegMax;",
        1,
    ),
    "value_fragments_not_transposed": (
        "ldmatrix_x4_trans(b, &s_v[",
        "ldmatrix_x4(b, &s_v[",
        1,
    ),
    "key_matrices_in_the_wrong_order": (
        "key0 + np * 16 + j / 2 * 8 + lane % 8,",
        "key0 + np * 16 + j % 2 * 8 + lane % 8,",
        1,
    ),
    "row_max_of_one_lane": (
        "row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(kFullMask, row_max[r], 2));",
        "",
        1,
    ),
    "missing_output_rescale": (
        "for (int i = 0; i < 4; ++i) o[d][i] *= alpha[i / 2];",
        "for (int i = 0; i < 4; ++i) o[d][i] *= 1.f;",
        1,
    ),
    "missing_sum_rescale": ("    l[r] *= alpha[r];\n", "", 1),
    "row_sums_of_one_lane": (
        "    l[r] += __shfl_xor_sync(kFullMask, l[r], 1);\n",
        "",
        1,
    ),
    "warps_combined_unweighted": (
        "acc += s_o[(w * kTileHeads + g) * HEAD_SIZE + d] * s_l[w * kTileHeads + g];",
        "acc += s_o[(w * kTileHeads + g) * HEAD_SIZE + d] * 0.25f;",
        1,
    ),
    "v1_output_row_by_block_not_sequence": (
        "out + ((long long)seq * num_heads + tile.first_head) * HEAD_SIZE, HEAD_SIZE, nullptr,",
        "out + ((long long)blockIdx.y * num_heads + tile.first_head) * HEAD_SIZE, HEAD_SIZE, 0,",
        1,
    ),
    "tile_heads_start_at_the_kv_head": (
        "return {kv_head, kv_head * group + tile * kTileHeads,",
        "return {kv_head, kv_head + tile * kTileHeads,",
        1,
    ),
    "partition_stats_rows_adjacent": ("exp_sums + row, gridDim.z,", "exp_sums + row, 1,", 1),
    "count_never_reset": ("    if (s_last) *count = 0;\n", "", 1),
    "no_partition_is_last": (
        "s_last = atomicAdd(count, 1) == num_partitions - first_partition - 1;",
        "s_last = atomicAdd(count, 1) == num_partitions - first_partition;",
        1,
    ),
    "combine_sums_one_lane_of_partitions": (
        "exp_sum = warp_sum(exp_sum) + __expf(sink - max_logit);",
        "exp_sum += __expf(sink - max_logit);",
        1,
    ),
    "partials_combined_unscaled": (
        "acc[e] += partial[u][e] * weight[u];",
        "acc[e] += partial[u][e];",
        1,
    ),
    "combine_slot_past_the_end_weighed": (
        "                        : 0.f;",
        "                        : 1.f;",
        1,
    ),
    "window_not_masked": (
        "s[n][i] = token >= options.visible_from && token < end_token ? score : kNegMax;",
        "s[n][i] = token < end_token ? score : kNegMax;",
        1,
    ),
    "softcap_ignored": (
        "if (options.softcap > 0.f) score = options.softcap * tanhf(score / options.softcap);",
        "",
        1,
    ),
    "alibi_backwards": (
        "score += slope[i / 2] * (float)(token - options.query_pos);",
        "score += slope[i / 2] * (float)(options.query_pos - token);",
        1,
    ),
    "v1_sinks_ignored": (
        "float exp_sum = options.sinks != nullptr ? __expf(options.sinks[g] - max_logit) : 0.f;",
        "float exp_sum = 0.f;",
        1,
    ),
    "v2_sinks_ignored": (
        "exp_sum = warp_sum(exp_sum) + __expf(sink - max_logit);",
        "exp_sum = warp_sum(exp_sum);",
        1,
    ),
    "combine_reads_partitions_before_the_window": (
        "for (int p0 = first_partition; p0 < num_partitions; p0 += kCombineUnroll) {",
        "for (int p0 = 0; p0 < num_partitions; p0 += kCombineUnroll) {",
        1,
    ),
    "combine_over_stages_still_read": (
        "  __syncthreads();  // the K/V space is free for the combine\n",
        "",
        1,
    ),
}


def mma_checks_pass(source: str) -> bool:
    """v1 (in order and longest first) and v2 (64-token partitions) on heads of 64 in float16:
    groups of 4 over two kv heads, contexts that end inside a warp's slice, on a stage boundary
    and a few stages in, plain, with a window, soft cap and sinks, and with ALiBi; warps in step,
    then racing."""
    module = mma_module(torch.float16, 64, 16)
    emulator = Emulator(source, list(module.name_expressions), module.defines)

    def launch(kernel_launch) -> None:
        if kernel_launch.module.source == "paged_attention_mma.cu":
            emulator.launch(kernel_launch)
        else:
            module_emulator(kernel_launch.module).launch(kernel_launch)

    lens = (1, 17, 64, 100, 257)
    cases = [
        make_decode_case(torch.float16, 8, 2, 64, 16, lens),
        make_decode_case(torch.float16, 8, 2, 64, 16, lens, window=90, softcap=5.0, sinks=True),
        make_decode_case(torch.float16, 8, 2, 64, 16, lens, alibi=True),
    ]
    longest_first = torch.tensor(
        sorted(range(len(lens)), key=lambda i: -lens[i]), dtype=torch.int32
    )
    counters = mma.counters(torch.device("cpu"), 1)  # what a planted bug leaves there, it clears
    try:
        for racing, case in itertools.product((False, True), cases):
            emulator.set_racing(racing)
            check_decode(launch, case, version=1, tensor_cores=True)
            check_decode(launch, case, 1, tensor_cores=True, seq_order=longest_first)
            check_decode(launch, case, 2, partition_size=64, tensor_cores=True)
            check_decode(launch, case, 2, partition_size=64, tensor_cores=True)  # a second launch
    except (AssertionError, EmulationError):
        return False
    finally:
        counters.zero_()
    return True


def test_original_passes() -> None:
    assert mma_checks_pass(kernel_source("paged_attention_mma.cu"))


@pytest.mark.parametrize("name", MUTATIONS)
def test_mutation_is_caught(name: str) -> None:
    source = mutate(kernel_source("paged_attention_mma.cu"), *MUTATIONS[name])
    assert not mma_checks_pass(source), f"the tests miss the bug {name!r}"
