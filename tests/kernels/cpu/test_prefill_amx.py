"""The AMX prefill kernel (kernels/prefill_attention_amx.c) against the reference: whole prompts
and chunks after cached context, longer than a key chunk (128) and a query block (32), every
head size it takes, GQA, windows, sinks and ALiBi, on the NaN-poisoned scattered cache of the
other prefill tests (a read past a context or before a window shows). Skipped without AMX."""

import pytest
import torch

from pagedgen.kernels.cpu import amx_error, amx_supports, paged_attention_prefill
from pagedgen.kernels.cpu_features import has_amx_bf16, kernel_march
from tests.kernels.prefill_cases import PrefillCase, make_prefill_case, prefill_reference

# Where the CPU has AMX, a kernel that fails to build fails these tests: it does not skip them.
pytestmark = pytest.mark.skipif(
    not has_amx_bf16() or kernel_march() != "native", reason="no AMX bfloat16 tiles here"
)


def test_it_builds():
    assert amx_error() is None


# a lone token; prompts of a block and a row, of several chunks ending mid-block; chunks after
# cached context, one ending exactly on a chunk boundary (256), one of a single row
SEQS = ((1, 1), (33, 33), (300, 300), (40, 170), (128, 256), (1, 45), (70, 520))


def run(case: PrefillCase, num_threads: int = 2, query: torch.Tensor | None = None) -> torch.Tensor:
    query = case.query if query is None else query
    out = torch.full_like(query, float("nan"))
    starts, lens = case.cu_seqlens_q[:-1].contiguous(), torch.tensor(case.query_lens).int()
    paged_attention_prefill(
        out,
        query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        starts,
        lens,
        case.context_lens,
        case.scale,
        num_threads,
        window=case.window,
        softcap=case.softcap,
        sinks=case.sinks,
        alibi_slopes=case.alibi_slopes,
        amx=True,
    )
    return out


def check(case: PrefillCase, num_threads: int = 2) -> None:
    out = run(case, num_threads)
    expected = prefill_reference(case)
    torch.testing.assert_close(out.float(), expected.float(), atol=1.6e-2, rtol=1.6e-2)


def case(num_heads=8, num_kv_heads=2, head_dim=64, block_size=16, seqs=SEQS, **options):
    return make_prefill_case(
        torch.bfloat16, num_heads, num_kv_heads, head_dim, block_size, seqs, **options
    )


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 256, 48, 80, 112])  # 48..: padded
@pytest.mark.parametrize("num_heads,num_kv_heads", [(9, 3), (8, 1), (4, 4)])
def test_head_sizes_and_groups(head_dim, num_heads, num_kv_heads):
    check(case(num_heads, num_kv_heads, head_dim, seed=head_dim + num_heads))


@pytest.mark.parametrize("block_size", [1, 16, 48])
def test_block_sizes(block_size):
    check(case(block_size=block_size))


@pytest.mark.parametrize("window", [1, 8, 37, 128, 200])
def test_windows(window):
    """Windows shorter than a query block (its rows see different keys), one of a chunk, one
    wider: blocks wholly before the first query's window are poisoned."""
    check(case(window=window, seed=window))


@pytest.mark.parametrize("window", [None, 50])
def test_sinks(window):
    check(case(window=window, sinks=True))


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("sinks", [False, True])  # with a sink, a shifted bias origin shows
def test_alibi(head_dim, sinks):
    check(case(16, 16, head_dim, alibi=True, sinks=sinks, seed=head_dim))


@pytest.mark.parametrize("window", [None, 37])
def test_soft_caps(window):
    """Gemma 2's: softcap * tanh(scores / softcap), the cap below the scores' spread."""
    check(case(window=window, softcap=5.0, seed=7))


@pytest.mark.parametrize("num_threads", [1, 3, 64])
def test_threads(num_threads):
    check(case(), num_threads)


def test_a_row_does_not_depend_on_its_block_or_chunk():
    """A prompt prefilled whole and the same prompt as a chunk after its first 77 tokens give
    the same bits, as do the rows of a block of one."""
    seqs = ((300, 300),)
    whole = case(seqs=seqs, seed=5)
    chunk = whole._replace(
        query=whole.query[77:],
        cu_seqlens_q=torch.tensor([0, 223], dtype=torch.int32),
        query_lens=[223],
    )
    assert torch.equal(run(whole)[77:], run(chunk))
    last = whole._replace(
        query=whole.query[-1:], cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32), query_lens=[1]
    )
    assert torch.equal(run(whole)[-1:], run(last))


def test_what_it_takes():
    query, cache = torch.zeros(1, 4, 64, dtype=torch.bfloat16), torch.zeros(1, 16, 4, 64)
    assert amx_supports(query, cache.bfloat16())
    assert not amx_supports(query, cache)  # a float32 cache
    assert not amx_supports(query.float(), cache)
    assert amx_supports(query[..., :48], cache[..., :48].bfloat16())
    assert not amx_supports(query[..., :40], cache[..., :40].bfloat16())
    big = torch.zeros(1, 1, 576, dtype=torch.bfloat16)  # MLA's latent: the tiled kernel's
    assert not amx_supports(big, big[None])
    with pytest.raises(ValueError, match="AMX prefill kernel"):
        run(case(head_dim=40))
