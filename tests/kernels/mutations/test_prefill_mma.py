"""The tensor-core prefill kernel's emulation checks must catch typical bugs: each mutation below
is planted into a copy of kernels/prefill_attention_mma.cu (its headers inlined), built for the
CPU, and the checks of test_emulated_prefill_mma.py must fail on it, under either schedule."""

import pytest
import torch

from pagedgen.kernels.prefill_attention import prefill_mma_module
from pagedgen.kernels.source import kernel_source
from tests.kernels.emulator import EmulationError, Emulator, have_gxx
from tests.kernels.mutations.test_paged_attention import mutate
from tests.kernels.prefill_cases import check_prefill, make_prefill_case

pytestmark = [
    pytest.mark.slow,  # each mutation builds its own copy of a kernel
    pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation"),
]

# name: (original text, planted bug, how often the text occurs)
MUTATIONS = {
    "not_causal": ("const bool visible = key <= q_pos[r] &&", "const bool visible = true &&", 1),
    "window_ignored": (
        "(window <= 0 || key > q_pos[r] - window);",
        "(window <= 0 || key >= 0);",
        1,
    ),
    "softcap_ignored": (
        "if (softcap > 0.f) score = softcap * tanhf(score / softcap);",
        "",
        1,
    ),
    "alibi_backwards": (
        "score += slope[r] * (float)(key - q_pos[r]);",
        "score += slope[r] * (float)(q_pos[r] - key);",
        1,
    ),
    "sinks_ignored": (
        "    if (sinks != nullptr) {  // one more key",
        "    if (false) {  // one more key",
        1,
    ),
    "no_wait_for_the_tile": ("cp_async_wait<kStages - 2>();", "cp_async_wait<kStages - 1>();", 1),
    "no_barrier_after_the_wait": (
        "    __syncthreads();               // everyone's have, and tile t - 1's",
        "    // everyone's have, and tile t - 1's",
        1,
    ),
    "warps_skip_tiles_they_see": (
        "tile_key <= warp_last_pos &&",
        "tile_key <= warp_first_pos &&",
        1,
    ),
    "missing_output_rescale": (
        "for (int i = 0; i < 4; ++i) o[d][i] *= alpha[i / 2];",
        "for (int i = 0; i < 4; ++i) o[d][i] *= 1.f;",
        1,
    ),
    "missing_sum_rescale": ("    l[r] *= alpha[r];\n", "", 1),
    "row_max_of_one_lane": (
        "row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(kFullMask, row_max[r], 1));",
        "",
        1,
    ),
    "value_fragments_not_transposed": ("ldmatrix_x4_trans(b, &s_v[", "ldmatrix_x4(b, &s_v[", 1),
    "probabilities_of_the_other_row": (
        "pack2<T>(p[2 * ks][2], p[2 * ks][3])",
        "pack2<T>(p[2 * ks][0], p[2 * ks][1])",
        1,
    ),
    "row_head_of_the_kv_head": (
        "head_of[r] = kv_head * group + row % group;",
        "head_of[r] = kv_head * group;",
        1,
    ),
    "pairs_stored_swapped": (
        "pack2<T>(o[d][2 * r] * inv_sum, o[d][2 * r + 1] * inv_sum)",
        "pack2<T>(o[d][2 * r + 1] * inv_sum, o[d][2 * r] * inv_sum)",
        1,
    ),
}


def prefill_mma_checks_pass(source: str) -> bool:
    """Heads of 64 in float16, 3:1 GQA (tiles straddle a token's heads), with and without a
    window, soft cap, sinks and ALiBi, under both schedules."""
    module = prefill_mma_module(torch.float16, 64, 16)
    emulator = Emulator(source, list(module.name_expressions), module.defines)
    seqs = ((1, 1), (37, 37), (20, 90), (1, 30), (30, 200))
    cases = [
        make_prefill_case(torch.float16, 6, 2, 64, 16, seqs),
        make_prefill_case(torch.float16, 6, 2, 64, 16, seqs, window=40, softcap=5.0, sinks=True),
        make_prefill_case(torch.float16, 6, 2, 64, 16, seqs, alibi=True),
    ]
    try:
        for racing in (False, True):
            emulator.set_racing(racing)
            for case in cases:
                check_prefill(emulator.launch, case, tensor_cores=True)
    except (AssertionError, EmulationError):
        return False
    return True


def test_original_passes() -> None:
    assert prefill_mma_checks_pass(kernel_source("prefill_attention_mma.cu"))


@pytest.mark.parametrize("name", MUTATIONS)
def test_mutation_is_caught(name: str) -> None:
    source = mutate(kernel_source("prefill_attention_mma.cu"), *MUTATIONS[name])
    assert not prefill_mma_checks_pass(source), f"the tests miss the bug {name!r}"
