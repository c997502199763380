"""The decode kernels with L2 prefetch on (kernels/kv_prefetch.cuh, l2_prefetch=True), run on the
CPU through cuda_emu.h: results still match the torch reference, and the prefetches ask for
exactly the lines of the KV blocks that the warps read next (recorded by the emulator), for the
per-head and the grouped kernels, one pass and partitioned, aligned rows and rows that straddle
cache lines."""

import bisect
from collections import defaultdict
from collections.abc import Callable

import pytest
import torch

from pagedgen.kernels.launch import KernelLaunch
from pagedgen.kernels.paged_attention import NUM_THREADS, paged_attention_launches
from pagedgen.kernels.source import kernel_source
from tests.kernels.emulator import Emulator, have_gxx
from tests.kernels.mutations.test_paged_attention import mutate
from tests.kernels.paged_cases import (
    DecodeCase,
    check_decode,
    decode_launches,
    make_decode_case,
    run_decode,
)

NUM_WARPS = NUM_THREADS // 32  # both kernels: a warp takes every NUM_WARPS-th block
LINE = 128
# (dtype, num_heads, num_kv_heads, head_size, block_size, window, cache dtype): Llama-3's GQA
# with 256-byte rows; 160-byte rows in blocks of 8 (head 80 in float16); float32 rows in blocks
# of 32; a window (the per-head kernel only: the grouped one declines windows); 80-byte fp8 rows,
# which straddle lines.
CASES = [
    (torch.bfloat16, 8, 2, 128, 16, None, None),
    (torch.float16, 4, 1, 80, 8, None, None),
    (torch.float32, 6, 2, 64, 32, None, None),
    (torch.bfloat16, 8, 2, 64, 16, 100, None),
    (torch.float16, 4, 1, 80, 16, None, torch.float8_e4m3fn),
]
CONTEXT_LENS = (1, 15, 17, 100, 257, 1100)
# (grouped, version, partition size): partitions of several blocks a warp
PLANS = [(False, 1, None), (False, 2, 512), (True, 1, None), (True, 2, 256)]


def line_aligned(cache: torch.Tensor) -> torch.Tensor:
    """A copy that starts on a cache line, as a GPU pool does (the CPU allocator aligns to 64):
    a row of whole lines then spans just those lines."""
    buffer = torch.empty(cache.numel() * cache.element_size() + LINE, dtype=torch.uint8)
    start = -buffer.data_ptr() % LINE
    copy = buffer[start : start + cache.numel() * cache.element_size()]
    return copy.view(cache.dtype).view(cache.shape).copy_(cache)


def make_case(spec) -> DecodeCase:
    dtype, num_heads, num_kv_heads, head_size, block_size, window, cache_dtype = spec
    case = make_decode_case(
        dtype, num_heads, num_kv_heads, head_size, block_size, CONTEXT_LENS, seed=5,
        cache_dtype=cache_dtype, window=window,
    )  # fmt: skip
    return case._replace(
        key_cache=line_aligned(case.key_cache), value_cache=line_aligned(case.value_cache)
    )


def plan(case: DecodeCase, grouped: bool, version: int, partition_size: int | None):
    out = torch.empty_like(case.query)
    return decode_launches(case, out, version, partition_size, grouped=grouped, l2_prefetch=True)


def build_emulators(sources: dict[str, str] | None = None) -> dict[str, Emulator]:
    """One library a kernel source (sources: its text, if not the file's), built with the
    prefetch on, for every kernel the plans launch."""
    modules: dict[str, dict] = {}
    for spec in CASES:
        case = make_case(spec)
        for grouped, version, partition_size in PLANS:
            for launch in plan(case, grouped, version, partition_size):
                names = modules.setdefault(launch.module.source, {})
                names.setdefault(launch.name_expression, launch.module.defines)
    sources = sources or {}
    return {
        source: Emulator(
            sources.get(source, kernel_source(source)), sorted(names), next(iter(names.values()))
        )
        for source, names in modules.items()
    }


@pytest.fixture(scope="module")
def emulators() -> dict[str, Emulator]:
    if not have_gxx():
        pytest.skip("g++ not found: the CPU emulation of the CUDA kernels is compiled with it")
    return build_emulators()


def launcher(emulators: dict[str, Emulator]) -> Callable[[KernelLaunch], None]:
    return lambda launch: emulators[launch.module.source].launch(launch)


def take_all(emulators: dict[str, Emulator]) -> list[int]:
    return [address for e in emulators.values() for address in e.take_prefetched()]


def expected_rows(case: DecodeCase, partition_size: int | None) -> list[int]:
    """The first byte of every K and V row that a warp reads after its first block: the rows of
    each kv head in blocks first + NUM_WARPS ... of every range of tokens one thread block
    attends (the whole window, or each partition of it)."""
    _, block_size, num_kv_heads, head_size = case.key_cache.shape
    element = case.key_cache.element_size()
    rows = []
    for seq, context_len in enumerate(case.context_lens.tolist()):
        start = 0 if case.window is None else max(0, context_len - case.window)
        step = partition_size or context_len
        for first_token in range(0, context_len, step):
            end = min(first_token + step, context_len)
            if end <= start:
                continue
            first_block = max(first_token, start) // block_size
            for b in range(first_block + NUM_WARPS, -(-end // block_size)):
                physical = case.block_table_lists[seq][b]
                for token in range(block_size):
                    for kv_head in range(num_kv_heads):
                        index = (physical * block_size + token) * num_kv_heads + kv_head
                        for cache in (case.key_cache, case.value_cache):
                            rows.append(cache.data_ptr() + index * head_size * element)
    return sorted(set(rows))


def check_prefetches(emulators, spec, grouped: bool, version: int, partition_size) -> None:
    case = make_case(spec)
    take_all(emulators)
    check_decode(launcher(emulators), case, version, partition_size or 512, grouped, True)
    assert case.key_cache.data_ptr() % LINE == 0
    prefetched = take_all(emulators)
    rows = expected_rows(case, partition_size)
    row_bytes = case.key_cache.shape[-1] * case.key_cache.element_size()
    lines_asked = defaultdict(set)  # of each row, by the addresses that fall in it
    for address in prefetched:
        i = bisect.bisect_right(rows, address) - 1
        assert i >= 0 and address - rows[i] < row_bytes, hex(address)  # in a row read later
        lines_asked[rows[i]].add(address // LINE)
    expected = {  # every line of every such row
        row: set(range(row // LINE, (row + row_bytes - 1) // LINE + 1)) for row in rows
    }
    # Compared first: pytest's diff of two such dicts (a planted bug's) can take many minutes.
    wrong = [
        row for row in expected.keys() | lines_asked.keys() if lines_asked[row] != expected.get(row)
    ]
    assert not wrong, (
        f"{len(wrong)} of {len(expected)} rows prefetched wrong, the first at {hex(min(wrong))}"
    )


@pytest.mark.parametrize(("grouped", "version", "partition_size"), PLANS, ids=str)
@pytest.mark.parametrize("spec", CASES, ids=str)
def test_prefetches_ask_for_the_next_blocks_lines(
    emulators, spec, grouped, version, partition_size
):
    if grouped and spec[5] is not None:
        pytest.skip("the grouped kernel declines windows")
    check_prefetches(emulators, spec, grouped, version, partition_size)


# name: (source, original text, planted bug, how often the text occurs in the inlined source)
MUTATIONS = {
    "per_head_prefetches_the_following_block": (
        "paged_attention.cu",
        "block_table, b + NUM_WARPS, end_block",
        "block_table, b + 1, end_block",
        1,
    ),
    "grouped_prefetches_the_following_block": (
        "paged_attention_grouped.cu",
        "block_table, b + NUM_WARPS, end_block",
        "block_table, b + 1, end_block",
        1,
    ),
    "prefetch_past_the_last_block": (
        "paged_attention_grouped.cu",
        "next_block < end_block) {",
        "next_block <= end_block) {",
        1,
    ),
    "prefetch_without_the_kv_head": (
        "paged_attention.cu",
        "kv_head * HEAD_SIZE + (long long)block_table[next_block]",
        "(long long)block_table[next_block]",
        1,
    ),
    "values_not_prefetched": (
        "paged_attention.cu",
        "i < 2 * kRowPoints",
        "i < kRowPoints",
        1,
    ),
    "last_byte_not_prefetched": (
        "paged_attention_grouped.cu",
        " + (kRowBytes % kCacheLine != 0);",
        ";",
        1,
    ),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_mutation_is_caught(emulators, name: str) -> None:
    source, original, bug, count = MUTATIONS[name]
    mutated = build_emulators({source: mutate(kernel_source(source), original, bug, count)})
    grouped = source == "paged_attention_grouped.cu"
    caught = 0
    for spec in CASES[:1] + CASES[-1:]:  # 256-byte rows; fp8 rows that straddle lines
        for plan_ in [p for p in PLANS if p[0] == grouped]:
            try:
                check_prefetches(mutated, spec, *plan_)
            except AssertionError:
                caught += 1
    assert caught, f"the prefetch checks miss the bug {name!r}"


def test_without_the_flag_nothing_is_prefetched(emulators) -> None:
    """A module built without l2_prefetch compiles no prefetch (the emulator records none)."""
    case = make_case(CASES[0])
    plain = paged_attention_launches(
        torch.empty_like(case.query), *case[:5], case.max_context_len, case.scale, version=1
    )
    assert not any("PAGEDGEN_L2_PREFETCH=1" in d for launch in plain for d in launch.module.defines)
    emulator = Emulator(
        kernel_source("paged_attention.cu"), [plain[0].name_expression], plain[0].module.defines
    )
    out = run_decode(emulator.launch, case, version=1)
    assert not out.isnan().any()
    assert emulator.take_prefetched() == []


@pytest.mark.parametrize("grouped", [False, True])
def test_unless_told_only_the_per_head_kernel_prefetches(grouped: bool) -> None:
    """l2_prefetch=None, as the cupy backend passes it: the per-head kernel is built with
    prefetch (faster on every measured shape), the grouped one without."""
    case = make_case(CASES[0])
    launches = paged_attention_launches(
        torch.empty_like(case.query), *case[:5], case.max_context_len, case.scale,
        version=2, partition_size=512, grouped=grouped, l2_prefetch=None,
    )  # fmt: skip
    main, reduce = launches
    assert ("grouped" in main.name_expression) == grouped
    for launch in (main, reduce):  # a grouped plan's reduce is per-head code, built plain
        assert ("PAGEDGEN_L2_PREFETCH=1" in launch.module.defines) != grouped
