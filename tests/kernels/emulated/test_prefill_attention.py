"""kernels/prefill_attention.cu run on the CPU through cuda_emu.h, against the torch reference.

Each case, unless it says otherwise: 6 sequences over scattered blocks of a NaN-poisoned cache,
(query_len, context_len) = (1, 1), (15, 15), (37, 37), (20, 53), (1, 30), (9, 100): whole prompts
of one token, of less than a tile and of several tiles with a partial last block, and chunks
after a cached prefix. Query lengths times the GQA group are rarely multiples of the 16-row tile.
"""

import pytest
import torch

from pagedgen.kernels.prefill_attention import prefill_attention_launch
from tests.kernels.emulator import emulate, have_gxx
from tests.kernels.paged_cases import DTYPES
from tests.kernels.prefill_cases import (
    check_prefill,
    make_prefill_case,
    prefill_reference,
    run_prefill,
)

pytestmark = pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation")


@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes(dtype: torch.dtype, head_size: int) -> None:
    check_prefill(emulate, make_prefill_case(dtype, 8, 2, head_size, 16, seed=head_size))


@pytest.mark.parametrize("head_size", [80, 96, 256])
def test_other_head_sizes(head_size: int) -> None:
    case = make_prefill_case(torch.float16, 4, 2, head_size, 16, seed=head_size)
    check_prefill(emulate, case)


@pytest.mark.parametrize("block_size", [8, 32])
def test_block_sizes(block_size: int) -> None:
    case = make_prefill_case(torch.bfloat16, 4, 1, 64, block_size, seed=block_size)
    check_prefill(emulate, case)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (8, 2), (6, 2), (6, 1)])
def test_gqa(num_heads: int, num_kv_heads: int) -> None:
    """No grouping, 4:1, 3:1 (tiles straddle a token's heads) and 6:1."""
    case = make_prefill_case(torch.float32, num_heads, num_kv_heads, 64, 16, seed=num_heads)
    check_prefill(emulate, case)


def test_single_prompt_without_prefix() -> None:
    case = make_prefill_case(torch.float16, 4, 2, 128, 16, seqs=((70, 70),))
    check_prefill(emulate, case)


def test_long_cached_prefix() -> None:
    """A chunk whose prefix spans many tiles: the running max must rescale many times."""
    case = make_prefill_case(torch.float32, 2, 1, 64, 16, seqs=((5, 300), (33, 180)))
    check_prefill(emulate, case)


@pytest.mark.parametrize("window", [1, 7, 40])
def test_sliding_window(window: int) -> None:
    """Entries of blocks before the window point at a NaN block: they must never be read."""
    case = make_prefill_case(torch.float32, 4, 2, 64, 8, window=window, seed=window)
    check_prefill(emulate, case)


def test_softcap_and_window() -> None:
    case = make_prefill_case(torch.bfloat16, 4, 2, 128, 16, window=20, softcap=3.0)
    check_prefill(emulate, case)


@pytest.mark.parametrize("window", [None, 20])
def test_sinks(window: int | None) -> None:
    """gpt-oss: each head's sink joins its softmax once, after the online max and sum over the
    keys; some sinks outweigh every score, some none."""
    case = make_prefill_case(torch.bfloat16, 8, 2, 64, 16, window=window, sinks=True)
    check_prefill(emulate, case)
    plain = prefill_reference(case._replace(sinks=None))
    assert (plain - prefill_reference(case)).abs().max() > 0.1  # the sinks matter here


# (window, softcap, sinks) with BLOOM's slopes, as in test_emulated_attention.py's ALIBI_OPTIONS:
# alone, capped, windowed (over a freed prefix), both, and with sinks pinning the bias's origin.
ALIBI_OPTIONS = [
    (None, None, False),
    (None, 3.0, False),
    (20, None, False),
    (7, 30.0, False),
    (None, None, True),
]


@pytest.mark.parametrize(("window", "softcap", "sinks"), ALIBI_OPTIONS, ids=str)
def test_alibi(window: int | None, softcap: float | None, sinks: bool) -> None:
    """Each packed row's slope is its own head's, and its bias counts from its own position."""
    case = make_prefill_case(
        torch.float32, 8, 2, 64, 16, window=window, softcap=softcap, sinks=sinks, alibi=True
    )
    check_prefill(emulate, case)
    plain = prefill_reference(case._replace(alibi_slopes=None))
    assert (plain - prefill_reference(case)).abs().max() > 0.1  # the slopes matter here


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(6, 6), (6, 2)])
def test_alibi_dtypes_and_groups(dtype: torch.dtype, num_heads: int, num_kv_heads: int) -> None:
    """BLOOM and MPT are MHA; a 3:1 group has tiles straddling a token's heads."""
    case = make_prefill_case(dtype, num_heads, num_kv_heads, 128, 16, seed=num_kv_heads, alibi=True)
    check_prefill(emulate, case)


def test_strided_query_rows() -> None:
    """Queries as the q part of a fused qkv projection: rows q_stride apart, not contiguous."""
    case = make_prefill_case(torch.float32, 4, 2, 64, 16, seqs=((17, 17), (6, 40)))
    qkv = torch.randn(23, 8, 64)
    qkv[:, :4] = case.query
    expected = run_prefill(emulate, case)
    strided = run_prefill(emulate, case, query=qkv[:, :4])
    torch.testing.assert_close(strided, expected, atol=0, rtol=0)


def test_rows_before_the_first_sequence_are_untouched() -> None:
    """The backend hands the whole step with cu_seqlens_q of the prefill sequences only: the
    decode rows before them belong to the decode kernel."""
    case = make_prefill_case(torch.float32, 4, 2, 64, 16, seqs=((9, 9), (4, 30)))
    num_decode = 3
    query = torch.cat([torch.randn(num_decode, 4, 64), case.query])
    out = torch.full_like(query, 7.0)
    kernel_launch = prefill_attention_launch(
        out,
        query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.cu_seqlens_q + num_decode,
        case.context_lens,
        9,
        case.scale,
    )
    assert kernel_launch is not None and kernel_launch.grid == (2, 2, 2)
    emulate(kernel_launch)
    assert torch.all(out[:num_decode] == 7.0)
    torch.testing.assert_close(out[num_decode:], run_prefill(emulate, case), atol=0, rtol=0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"query": torch.zeros(10, 4, 72)}, "head_size"),
        ({"query": torch.zeros(10, 4, 64, dtype=torch.float64)}, "dtype"),
        ({"query": torch.zeros(10, 3, 64)}, "multiple of num_kv_heads"),
        ({"block_tables": torch.zeros(2, 4, dtype=torch.int64)}, "block_tables must be"),
        ({"cu_seqlens_q": torch.zeros(2, dtype=torch.int32)}, "cu_seqlens_q"),
        ({"window": 0}, "window"),
        ({"softcap": -1.0}, "softcap"),
        ({"alibi_slopes": torch.ones(3)}, "3 alibi_slopes for 4 heads"),
        ({"alibi_slopes": torch.ones(4, dtype=torch.float16)}, "alibi_slopes must be"),
        ({"max_query_len": 10**6}, "too long"),
    ],
)
def test_wrapper_rejects_bad_arguments(change: dict, message: str) -> None:
    case = make_prefill_case(torch.float32, 4, 2, 64, 16, seqs=((6, 6), (4, 30)))
    args = {
        "query": case.query,
        "key_cache": case.key_cache,
        "value_cache": case.value_cache,
        "block_tables": case.block_tables,
        "cu_seqlens_q": case.cu_seqlens_q,
        "context_lens": case.context_lens,
        "max_query_len": 6,
        "scale": case.scale,
    } | change
    args["out"] = torch.empty_like(args["query"])
    with pytest.raises(ValueError, match=message):
        prefill_attention_launch(**args)


def test_empty_batch_plans_nothing() -> None:
    case = make_prefill_case(torch.float32, 4, 2, 64, 16, seqs=((6, 6),))
    no_seqs = torch.zeros(1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)
    out = torch.empty_like(case.query)
    args = (out, case.query, case.key_cache, case.value_cache, case.block_tables[:0])
    assert prefill_attention_launch(*args, *no_seqs, 0, case.scale) is None
