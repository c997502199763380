"""kernels/paged_attention.cu run on the CPU through cuda_emu.h, against the torch reference.

Each case: 6 sequences with context lengths 1, 15, 16, 17, 100, 257 (one token, a block minus
one, exactly a block, a block plus one, several blocks, several partitions) over scattered
blocks in a NaN-poisoned cache.
"""

import pytest
import torch

from pagedgen.kernels.attention_args import HEAD_SIZES
from pagedgen.kernels.decode_plan import PARTITION_SIZE, use_v1
from pagedgen.kernels.paged_attention import paged_attention_launches
from tests.kernels.paged_cases import (
    DTYPES,
    SMALL_PARTITION_SIZE,
    check_decode,
    make_decode_case,
    reference,
    run_decode,
)


@pytest.mark.parametrize("head_size", HEAD_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_v1_head_sizes(attention_emulator, dtype: torch.dtype, head_size: int) -> None:
    case = make_decode_case(dtype, 4, 2, head_size, 16, seed=head_size)
    check_decode(attention_emulator.launch, case, version=1)


@pytest.mark.parametrize("head_size", [80, 128])
@pytest.mark.parametrize("block_size", [8, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_v1_block_sizes(attention_emulator, dtype: torch.dtype, block_size: int, head_size: int):
    case = make_decode_case(dtype, 4, 2, head_size, block_size, seed=block_size)
    check_decode(attention_emulator.launch, case, version=1)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (6, 1), (8, 2)])
def test_v1_gqa(attention_emulator, num_heads: int, num_kv_heads: int) -> None:
    case = make_decode_case(torch.float32, num_heads, num_kv_heads, 64, 16, seed=num_heads)
    check_decode(attention_emulator.launch, case, version=1)


@pytest.mark.parametrize(
    ("head_size", "block_size"), [(64, 8), (96, 16), (128, 32), (256, 16)], ids=str
)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_v2_partitions(attention_emulator, dtype: torch.dtype, head_size: int, block_size: int):
    case = make_decode_case(dtype, 4, 2, head_size, block_size, seed=head_size + block_size)
    check_decode(attention_emulator.launch, case, version=2, partition_size=SMALL_PARTITION_SIZE)


def test_v2_single_partition(attention_emulator) -> None:
    case = make_decode_case(torch.float16, 4, 2, 128, 16)
    check_decode(attention_emulator.launch, case, version=2, partition_size=PARTITION_SIZE)


def test_strided_query_rows(attention_emulator) -> None:
    """Queries as the q part of a fused qkv projection: rows q_stride apart, not contiguous."""
    case = make_decode_case(torch.float32, 4, 2, 64, 16, context_lens=(17, 100))
    qkv = torch.randn(2, 8, 64)
    qkv[:, :4] = case.query
    expected = run_decode(attention_emulator.launch, case, version=1)
    strided = run_decode(attention_emulator.launch, case, version=1, query=qkv[:, :4])
    torch.testing.assert_close(strided, expected, atol=0, rtol=0)


def test_v1_v2_rule_matches_vllm() -> None:
    assert use_v1(512, 1, 32, 512)
    assert not use_v1(513, 1, 32, 512)
    assert use_v1(4096, 64, 32, 512)  # 2048 (head, sequence) blocks fill the GPU
    assert not use_v1(8193, 64, 32, 512)
    case = make_decode_case(torch.float32, 4, 2, 64, 16, context_lens=(600,))
    out = torch.empty_like(case.query)
    args = (out, case.query, case.key_cache, case.value_cache, case.block_tables)
    launches = paged_attention_launches(*args, case.context_lens, 600, case.scale)
    assert [launch.grid for launch in launches] == [(4, 1, 2), (4, 1, 1)]
    assert "v2_kernel" in launches[0].name_expression and "reduce" in launches[1].name_expression


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"query": torch.zeros(6, 4, 72)}, "head_size"),
        ({"query": torch.zeros(6, 4, 64, dtype=torch.float64)}, "dtype"),
        ({"query": torch.zeros(6, 3, 64)}, "multiple of num_kv_heads"),
        ({"block_tables": torch.zeros(6, 17, dtype=torch.int64)}, "block_tables must be"),
        ({"context_lens": torch.zeros(5, dtype=torch.int32)}, "context lens"),
        ({"max_context_len": 10_000}, "exceeds"),
    ],
)
def test_wrapper_rejects_bad_arguments(change: dict, message: str) -> None:
    case = make_decode_case(torch.float32, 4, 2, 64, 16)
    args = {
        "query": case.query,
        "key_cache": case.key_cache,
        "value_cache": case.value_cache,
        "block_tables": case.block_tables,
        "context_lens": case.context_lens,
        "max_context_len": case.max_context_len,
        "scale": case.scale,
    } | change
    args["out"] = torch.empty_like(args["query"])
    with pytest.raises(ValueError, match=message):
        paged_attention_launches(**args)


# (window, softcap, sinks): a window inside one block, one of whole blocks, one over several
# partitions, a window of one token; Gemma 2's soft cap; gpt-oss's sinks with and without its
# window. Blocks before a window are freed (NaN, their table entries at block 0).
OPTIONS = [
    (5, None, False),
    (32, None, False),
    (150, None, False),
    (1, None, False),
    (None, 30.0, False),
    (40, 5.0, False),
    (None, None, True),
    (100, None, True),
]


@pytest.mark.parametrize(("window", "softcap", "sinks"), OPTIONS, ids=str)
@pytest.mark.parametrize("version", [1, 2])
def test_windows_softcaps_and_sinks(attention_emulator, version, window, softcap, sinks):
    case = make_decode_case(
        torch.bfloat16, 8, 2, 64, 16, seed=7, window=window, softcap=softcap, sinks=sinks
    )
    check_decode(attention_emulator.launch, case, version, SMALL_PARTITION_SIZE)
    if window is not None:
        plain = make_decode_case(torch.bfloat16, 8, 2, 64, 16, seed=7, softcap=softcap)
        assert not torch.equal(reference(case), reference(plain._replace(sinks=case.sinks)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_size", [80, 256])
def test_window_and_sinks_every_dtype(attention_emulator, dtype, head_size):
    case = make_decode_case(dtype, 4, 1, head_size, 8, seed=head_size, window=20, sinks=True)
    check_decode(attention_emulator.launch, case, 2, SMALL_PARTITION_SIZE)
    check_decode(attention_emulator.launch, case, 1)


# (window, softcap, sinks) with BLOOM's slopes: alone, under Gemma 2's soft cap, with a window
# (inside one partition, and over several with a cap); with sinks, which pin the bias's origin at
# the query (without them a constant shift of every score of a row would cancel in its softmax).
ALIBI_OPTIONS = [
    (None, None, False),
    (None, 30.0, False),
    (40, None, False),
    (150, 5.0, False),
    (None, None, True),
]


@pytest.mark.parametrize(("window", "softcap", "sinks"), ALIBI_OPTIONS, ids=str)
@pytest.mark.parametrize("version", [1, 2])
def test_alibi(attention_emulator, version, window, softcap, sinks):
    case = make_decode_case(
        torch.bfloat16, 8, 2, 64, 16, seed=3, window=window, softcap=softcap, sinks=sinks,
        alibi=True,
    )  # fmt: skip
    check_decode(attention_emulator.launch, case, version, SMALL_PARTITION_SIZE)
    plain = reference(case._replace(alibi_slopes=None))
    assert (plain - reference(case)).abs().max() > 0.1  # the slopes matter here


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("version", [1, 2])
def test_alibi_every_dtype(attention_emulator, dtype, version):
    case = make_decode_case(dtype, 6, 6, 128, 8, seed=5, alibi=True)
    check_decode(attention_emulator.launch, case, version, SMALL_PARTITION_SIZE)


@pytest.mark.parametrize(
    "option", [{"window": 9}, {"softcap": 20.0}, {"sinks": True}, {"alibi": True}], ids=str
)
def test_grouped_is_declined_for_windows_softcaps_sinks_and_alibi(option: dict) -> None:
    """The grouped kernel has none of them: those layers keep the per-head kernels."""
    case = make_decode_case(torch.float16, 8, 2, 64, 16, **option)
    args = (torch.empty_like(case.query), case.query, case.key_cache, case.value_cache)
    args += (case.block_tables, case.context_lens, case.max_context_len, case.scale)
    options = {"window": case.window, "softcap": case.softcap, "sinks": case.sinks}
    options["alibi_slopes"] = case.alibi_slopes
    launches = paged_attention_launches(*args, grouped=True, **options)
    assert all("grouped" not in launch.name_expression for launch in launches)
