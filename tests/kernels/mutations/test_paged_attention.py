"""The emulation tests must catch typical kernel bugs: each mutation below is planted into a copy
of the kernel source, the copy is built for the CPU, and the same checks as
test_emulated_attention.py / test_emulated_cache_ops.py must fail on it."""

import pytest
import torch

from pagedgen.kernels.cache_ops import reshape_and_cache_launch, reshape_and_cache_module
from pagedgen.kernels.paged_attention import paged_attention_module
from pagedgen.kernels.source import kernel_source
from tests.kernels.emulator import EmulationError, Emulator, have_gxx
from tests.kernels.paged_cases import SMALL_PARTITION_SIZE, check_decode, make_decode_case

pytestmark = [
    pytest.mark.slow,  # each mutation builds its own copy of a kernel
    pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation"),
]

# name: (original text, planted bug, how often the text occurs)
ATTENTION_MUTATIONS = {
    "gqa_head_mapping": (
        "const int kv_head = head / (num_heads / num_kv_heads);",
        "const int kv_head = head % num_kv_heads;",
        2,
    ),
    "missing_acc_rescale": (
        "for (int e = 0; e < VEC; ++e) acc[i][e] *= alpha;",
        "for (int e = 0; e < VEC; ++e) acc[i][e] *= 1.f;",
        1,
    ),
    "missing_sum_rescale": ("l = l * alpha + ", "l = l + ", 1),
    "last_block_dropped": (
        "const int end_block = (end_token + BLOCK_SIZE - 1) / BLOCK_SIZE;",
        "const int end_block = end_token / BLOCK_SIZE;",
        1,
    ),
    "last_token_past_the_end": (
        "const int num_tokens = min(BLOCK_SIZE, end_token - b * BLOCK_SIZE);",
        "const int num_tokens = min(BLOCK_SIZE, end_token - b * BLOCK_SIZE + 1);",
        1,
    ),
    "missing_syncthreads_after_query": (
        "s_q[i] = to_float(q[i]) * scale;\n  __syncthreads();",
        "s_q[i] = to_float(q[i]) * scale;",
        1,
    ),
    "missing_syncthreads_before_merge": (
        "  }\n  __syncthreads();\n\n  // A warp that got no block",
        "  }\n\n  // A warp that got no block",
        1,
    ),
    "missing_syncwarp": (
        "if (part == 0) s_p[warp][token_in_block] = p;\n    __syncwarp();",
        "if (part == 0) s_p[warp][token_in_block] = p;",
        1,
    ),
    "reduce_ignores_partition_max": (
        "exp_sum += exp_sums[row + p] * __expf(max_logits[row + p] - max_logit);",
        "exp_sum += exp_sums[row + p];",
        1,
    ),
}
# Caught by the ALiBi checks of attention_checks_pass (a slope of 0 hides them from the others).
ALIBI_MUTATIONS = {
    "alibi_sign_flipped": ("score += alibi_slope *", "score -= alibi_slope *", 1),
    "alibi_key_position_in_block": (
        "(float)(b * BLOCK_SIZE + token_in_block - q_pos)",
        "(float)(token_in_block - q_pos)",
        1,
    ),
    # A constant shift of a row's scores: only its sink's weight shows it.
    "alibi_query_position_off_by_one": (
        "alibi_slopes[head], context_len - 1);",
        "alibi_slopes[head], context_len);",
        2,
    ),
    "alibi_slope_of_the_kv_head": ("alibi_slopes[head]", "alibi_slopes[kv_head]", 2),
    "alibi_before_softcap": (
        "    if (softcap > 0.f) score = softcap * tanhf(score / softcap);\n"
        "    score += alibi_slope * (float)(b * BLOCK_SIZE + token_in_block - q_pos);\n",
        "    score += alibi_slope * (float)(b * BLOCK_SIZE + token_in_block - q_pos);\n"
        "    if (softcap > 0.f) score = softcap * tanhf(score / softcap);\n",
        1,
    ),
    "alibi_dropped_in_v2": (
        "softcap, nullptr,\n      alibi_slopes == nullptr ? 0.f : alibi_slopes[head],",
        "softcap, nullptr,\n      0.f,",
        1,
    ),
}


def mutate(source: str, original: str, bug: str, count: int) -> str:
    assert source.count(original) == count, (
        f"kernel source changed; update the mutation {original!r}"
    )
    return source.replace(original, bug)


def attention_checks_pass(source: str, alibi: bool = False) -> bool:
    """The emulation checks of test_emulated_attention.py, on one key, v1 and v2; with alibi,
    those of its ALiBi tests: with sinks, and with a soft cap and a window over partitions."""
    dtype, head_size, block_size = torch.float32, 64, 16
    module = paged_attention_module(dtype, head_size, block_size)
    small = paged_attention_module(dtype, head_size, block_size, SMALL_PARTITION_SIZE)
    emulator = Emulator(
        source, [*module.name_expressions, *small.name_expressions[1:]], module.defines
    )
    shape = (dtype, 4, 2, head_size, block_size, (1, 17, 100, 257))
    cases = [make_decode_case(*shape)]
    if alibi:
        cases = [
            make_decode_case(*shape, sinks=True, alibi=True),
            make_decode_case(*shape, window=150, softcap=5.0, alibi=True),
        ]
    try:
        for case in cases:
            check_decode(emulator.launch, case, version=1)
            check_decode(emulator.launch, case, version=2, partition_size=SMALL_PARTITION_SIZE)
    except (AssertionError, EmulationError):
        return False
    return True


@pytest.mark.parametrize("alibi", [False, True], ids=["plain", "alibi"])
def test_original_attention_passes(alibi: bool) -> None:
    assert attention_checks_pass(kernel_source("paged_attention.cu"), alibi)


@pytest.mark.parametrize("name", ATTENTION_MUTATIONS)
def test_attention_mutation_is_caught(name: str) -> None:
    source = mutate(kernel_source("paged_attention.cu"), *ATTENTION_MUTATIONS[name])
    assert not attention_checks_pass(source), f"the emulation tests miss the bug {name!r}"


@pytest.mark.parametrize("name", ALIBI_MUTATIONS)
def test_alibi_mutation_is_caught(name: str) -> None:
    source = mutate(kernel_source("paged_attention.cu"), *ALIBI_MUTATIONS[name])
    assert not attention_checks_pass(source, alibi=True), f"the ALiBi checks miss {name!r}"


def reshape_and_cache_checks_pass(source: str) -> bool:
    module = reshape_and_cache_module(torch.float32, torch.float32)
    emulator = Emulator(source, list(module.name_expressions), module.defines)
    key_cache, value_cache = torch.randn(4, 8, 2, 64), torch.randn(4, 8, 2, 64)
    key, value = torch.randn(9, 2, 64), torch.randn(9, 2, 64)
    slot_mapping = torch.tensor([0, 5, -1, 31, 8, -1, 9, 17, 30])
    expected_key = key_cache.clone()
    expected_key.view(-1, 2, 64)[slot_mapping[slot_mapping >= 0]] = key[slot_mapping >= 0]
    emulator.launch(reshape_and_cache_launch(key, value, key_cache, value_cache, slot_mapping))
    return torch.equal(key_cache, expected_key)


@pytest.mark.parametrize(
    "original, bug",
    [
        ("if (slot < 0) return;", "if (slot <= 0) return;"),
        ("] = to_cache<CACHE_T>(key[", "] = to_cache<CACHE_T>(value["),
    ],
    ids=["skips_slot_0", "writes_value_as_key"],
)
def test_reshape_and_cache_mutation_is_caught(original: str, bug: str) -> None:
    source = kernel_source("reshape_and_cache.cu")
    assert reshape_and_cache_checks_pass(source)
    assert not reshape_and_cache_checks_pass(mutate(source, original, bug, 1))
