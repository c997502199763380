"""The prefill emulation checks must catch typical kernel bugs: each mutation below is planted
into a copy of kernels/prefill_attention.cu, the copy is built for the CPU, and the checks of
test_emulated_prefill.py must fail on it."""

import pytest
import torch

from pagedgen.kernels.prefill_attention import prefill_attention_module
from pagedgen.kernels.source import kernel_source
from tests.kernels.emulator import EmulationError, Emulator, have_gxx
from tests.kernels.mutations.test_paged_attention import mutate
from tests.kernels.prefill_cases import check_prefill, make_prefill_case

pytestmark = [
    pytest.mark.slow,  # each mutation builds its own copy of a kernel
    pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation"),
]

# name: (original text, planted bug, how often the text occurs). Every bug keeps its reads inside
# the tensors of prefill_checks_pass: a wild read could crash the test process instead of failing.
MUTATIONS = {
    "causal_bound_excludes_self": (
        "const bool visible = pos <= q_pos[r] &&",
        "const bool visible = pos < q_pos[r] &&",
        1,
    ),
    "causal_bound_sees_next_token": (
        "const bool visible = pos <= q_pos[r] &&",
        "const bool visible = pos <= q_pos[r] + 1 &&",
        1,
    ),
    "window_bound_off_by_one": (
        "pos > q_pos[r] - window",
        "pos >= q_pos[r] - window",
        1,
    ),
    "missing_acc_rescale": (
        "for (int j = 0; j < OUT_DIMS; ++j) acc[r][j] *= alpha;",
        "for (int j = 0; j < OUT_DIMS; ++j) acc[r][j] *= 1.f;",
        1,
    ),
    "missing_sum_rescale": ("l_run[r] = l_run[r] * alpha + ", "l_run[r] = l_run[r] + ", 1),
    "block_table_index_off_by_one": (
        "block_table[pos / BLOCK_SIZE] * BLOCK_SIZE",
        "block_table[(pos + 1) / BLOCK_SIZE] * BLOCK_SIZE",
        1,
    ),
    "block_table_of_the_wrong_sequence": (
        "block_tables + (long long)seq * max_num_blocks_per_seq;",
        "block_tables + (long long)(seq / 2) * max_num_blocks_per_seq;",
        1,
    ),
    "gqa_heads_interleaved": (
        "const int head = kv_head * group + row % group;",
        "const int head = kv_head + row % group * num_kv_heads;",
        2,
    ),
    "first_kv_tile_too_late": (
        "for (int tile = kv_begin / TILE_KEYS * TILE_KEYS;",
        "for (int tile = (kv_begin + TILE_KEYS - 1) / TILE_KEYS * TILE_KEYS;",
        1,
    ),
    "last_kv_tile_dropped": (
        "t.kv_end = t.first_pos + (t.tile_row + t.num_rows - 1) / group + 1;",
        "t.kv_end = t.first_pos + (t.tile_row + t.num_rows - 1) / group;",
        1,
    ),
    "softcap_dropped": (
        "if (softcap > 0.f) score[r] = softcap * tanhf(score[r] / softcap);",
        "",
        1,
    ),
    "missing_syncthreads_before_load": (
        "    __syncthreads();  // every warp is done with the previous tile\n",
        "",
        1,
    ),
    "missing_syncthreads_after_load": (
        "  }\n    __syncthreads();\n\n    float score",
        "  }\n\n    float score",
        1,
    ),
    "missing_syncwarp_before_values": (
        "    __syncwarp();\n\n    for (int t = 0;",
        "\n    for (int t = 0;",
        1,
    ),
}
# Caught by the ALiBi checks of prefill_checks_pass (a slope of 0 hides them from the others).
ALIBI_MUTATIONS = {
    "alibi_sign_flipped": ("score[r] += slope[r] *", "score[r] -= slope[r] *", 1),
    "alibi_key_position_in_tile": ("(float)(pos - q_pos[r])", "(float)(key - q_pos[r])", 1),
    # A constant shift of a row's scores: only its sink's weight shows it.
    "alibi_query_position_off_by_one": (
        "(float)(pos - q_pos[r])",
        "(float)(pos - q_pos[r] - 1)",
        1,
    ),
    "alibi_slope_of_the_groups_first_head": (
        "alibi_slopes[kv_head * group + (tile_row + m) % group]",
        "alibi_slopes[kv_head * group]",
        1,
    ),
    "alibi_before_softcap": (
        "      if (softcap > 0.f) score[r] = softcap * tanhf(score[r] / softcap);\n"
        "      score[r] += slope[r] * (float)(pos - q_pos[r]);\n",
        "      score[r] += slope[r] * (float)(pos - q_pos[r]);\n"
        "      if (softcap > 0.f) score[r] = softcap * tanhf(score[r] / softcap);\n",
        1,
    ),
}


def prefill_checks_pass(source: str, alibi: bool = False) -> bool:
    """test_emulated_prefill.py's checks on one instantiation: prompts and chunks after cached
    prefixes with GQA 4:1, and a sliding window over a freed (NaN) prefix with a soft cap; with
    alibi, the same with ALiBi slopes, the first with sinks too."""
    dtype, head_size, block_size = torch.float32, 64, 16
    module = prefill_attention_module(dtype, head_size, block_size)
    emulator = Emulator(source, list(module.name_expressions), module.defines)
    seqs = ((1, 1), (37, 37), (20, 53), (9, 100))
    options = {"sinks": True, "alibi": True} if alibi else {}
    cases = [
        make_prefill_case(dtype, 8, 2, head_size, block_size, seqs, **options),
        make_prefill_case(
            dtype, 4, 2, head_size, block_size, seqs[2:], window=19, softcap=3.0, alibi=alibi
        ),
    ]
    try:
        for case in cases:
            check_prefill(emulator.launch, case)
    except (AssertionError, EmulationError):
        return False
    return True


@pytest.mark.parametrize("alibi", [False, True], ids=["plain", "alibi"])
def test_original_prefill_passes(alibi: bool) -> None:
    assert prefill_checks_pass(kernel_source("prefill_attention.cu"), alibi)


@pytest.mark.parametrize("name", MUTATIONS)
def test_prefill_mutation_is_caught(name: str) -> None:
    source = mutate(kernel_source("prefill_attention.cu"), *MUTATIONS[name])
    assert not prefill_checks_pass(source), f"the emulation tests miss the bug {name!r}"


@pytest.mark.parametrize("name", ALIBI_MUTATIONS)
def test_prefill_alibi_mutation_is_caught(name: str) -> None:
    source = mutate(kernel_source("prefill_attention.cu"), *ALIBI_MUTATIONS[name])
    assert not prefill_checks_pass(source, alibi=True), f"the ALiBi checks miss {name!r}"
