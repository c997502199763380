"""The C prefill attention kernel (kernels/prefill_attention_cpu.c) against the reference: whole
prompts and chunks after cached context, every build, cache dtype and head size, with windows
(blocks before a sequence's first visible position freed: entry -1, contents NaN), soft caps and
sinks; slots no sequence owns hold NaN, so a read past a context poisons the output."""

import pytest
import torch

from pagedgen.attention.kv_cache_dtype import writable
from pagedgen.attention.reference import paged_attention_reference
from pagedgen.kernels.cpu import cpu_kernel_error, kernel_dtypes, paged_attention_prefill
from tests.kernels.cpu.test_paged_attention import FP8, MARCHES, scattered_tables

pytestmark = pytest.mark.skipif(
    cpu_kernel_error() is not None, reason=f"no CPU kernel: {cpu_kernel_error()}"
)

# a whole prompt of one tile, one of many, chunks after cached context, a lone row, a prompt
# ending mid-tile, and a chunk shorter than the context before it
QUERY_LENS = [16, 70, 33, 1, 5, 40]
CONTEXT_LENS = [16, 70, 90, 20, 5, 300]


def prefill_case(head_dim, num_heads, num_kv_heads, window, dtype, seed, block_size=16):
    torch.manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in CONTEXT_LENS) + 8
    tables, block_tables = scattered_tables(CONTEXT_LENS, block_size, num_blocks, seed)
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    value_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim).to(dtype)
    visible = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    for i, (table, query_len, n) in enumerate(zip(tables, QUERY_LENS, CONTEXT_LENS)):
        first = max(0, n - query_len - window + 1) if window else 0
        for p in range(first, n):
            visible[table[p // block_size] * block_size + p % block_size] = True
        for b in range(first // block_size):  # freed: the kernel must not follow the entry
            block_tables[i, b] = -1
    nan = torch.tensor(float("nan")).to(dtype)
    for cache in (key_cache, value_cache):
        writable(cache).view(-1, num_kv_heads, head_dim)[~visible] = writable(nan)
    # query rows inside a wider fused projection, as the model hands them over
    fused = torch.randn(sum(QUERY_LENS), (num_heads + 2 * num_kv_heads) * head_dim)
    query = fused[:, : num_heads * head_dim].view(-1, num_heads, head_dim)
    return query, key_cache, value_cache, tables, block_tables, query_rows(QUERY_LENS)


def query_rows(query_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(query_starts, query_lens) of sequences whose rows follow each other."""
    starts = [0, *torch.tensor(query_lens).cumsum(0).tolist()[:-1]]
    return torch.tensor(starts, dtype=torch.int32), torch.tensor(query_lens, dtype=torch.int32)


def check(head_dim, num_heads, num_kv_heads, dtype=torch.float32, march=None, num_threads=2,
          window=None, softcap=None, sinks=None):  # fmt: skip
    query, key_cache, value_cache, tables, block_tables, rows = prefill_case(
        head_dim, num_heads, num_kv_heads, window, dtype, seed=head_dim + num_heads
    )
    scale = head_dim**-0.5
    out = torch.full(query.shape, float("nan"))
    lens = torch.tensor(CONTEXT_LENS, dtype=torch.int32)
    args = (key_cache, value_cache, block_tables, *rows, lens, scale, num_threads, march)
    paged_attention_prefill(out, query, *args, window=window, softcap=softcap, sinks=sinks)
    expected = paged_attention_reference(  # the kernel widens the cache exactly
        query,
        key_cache.float(),
        value_cache.float(),
        tables,
        CONTEXT_LENS,
        QUERY_LENS,
        scale,
        window,
        softcap,
        sinks,
    )
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, *FP8])
@pytest.mark.parametrize("head_dim", [64, 128, 256, 80, 40])  # 80, 40: rows padded to vectors
@pytest.mark.parametrize("num_heads,num_kv_heads", [(9, 3), (8, 1)])
def test_every_build_reads_every_cache_dtype(march, dtype, head_dim, num_heads, num_kv_heads):
    if dtype not in kernel_dtypes(march):
        pytest.skip(f"this compiler has no _Float16 for the {march} build")
    check(head_dim, num_heads, num_kv_heads, dtype, march)


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("num_heads", [16, 128])  # DeepSeek-V2-Lite's, V3's: the largest group
def test_mla_latent_shape(march, num_heads):
    """MLA's cache: one latent of 576 (kv_lora_rank 512 + rope 64) that all heads attend to."""
    check(576, num_heads, 1, torch.bfloat16, march)


@pytest.mark.parametrize("num_threads", [1, 2, 3, 64])  # 64: more threads than tiles of a seq
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2), (32, 2)])  # 16-row groups
def test_threads_split_tiles_anywhere(num_threads, num_heads, num_kv_heads):
    check(64, num_heads, num_kv_heads, num_threads=num_threads)


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize(
    "window,softcap,sinks",
    [
        (8, None, None),  # a window shorter than a tile: rows of one tile see different keys
        (37, None, None),  # longer, not a multiple of the block
        (1, None, None),  # each row sees itself
        (None, 5.0, None),  # Gemma 2's soft cap
        (20, None, torch.linspace(-5.0, 5.0, 8)),  # gpt-oss: sinks on a sliding layer
        (None, None, torch.linspace(5.0, -5.0, 8)),  # and a full one
    ],
)
def test_windows_softcaps_and_sinks(march, window, softcap, sinks):
    check(64, 8, 2, torch.bfloat16, march, window=window, softcap=softcap, sinks=sinks)


@pytest.mark.parametrize("march", MARCHES)
def test_bfloat16_query_and_output_are_the_float32_result_rounded(march):
    query, key_cache, value_cache, _, block_tables, rows = prefill_case(
        64, 9, 3, None, torch.bfloat16, seed=0
    )
    query = query.bfloat16()
    lens = torch.tensor(CONTEXT_LENS, dtype=torch.int32)
    args = (key_cache, value_cache, block_tables, *rows, lens, 0.125, 2, march)
    wide = paged_attention_prefill(torch.empty(query.shape), query.float(), *args)
    out = paged_attention_prefill(torch.empty_like(query), query, *args)
    assert out.dtype == torch.bfloat16 and torch.equal(out, wide.bfloat16())


def test_rows_of_some_sequences_only():
    """Query rows need not follow each other: sequences may take some of the rows (the cpu
    backend leaves rows past a prompt to the decode kernel), the rest untouched."""
    query, key_cache, value_cache, tables, block_tables, (starts, _) = prefill_case(
        64, 8, 2, None, torch.float32, seed=3
    )
    picked = [1, 2, 5]  # the first 30, 10 and 7 rows of three sequences
    lens = [30, 10, 7]
    contexts = [CONTEXT_LENS[i] - QUERY_LENS[i] + n for i, n in zip(picked, lens)]
    out = torch.full(query.shape, float("nan"))
    paged_attention_prefill(
        out,
        query,
        key_cache,
        value_cache,
        block_tables[picked],
        starts[picked],
        torch.tensor(lens, dtype=torch.int32),
        torch.tensor(contexts, dtype=torch.int32),
        0.125,
    )
    computed = torch.zeros(len(query), dtype=torch.bool)
    for i, n in zip(picked, lens):
        computed[starts[i] : starts[i] + n] = True
        expected = paged_attention_reference(
            query[starts[i] : starts[i] + n],
            key_cache.float(),
            value_cache.float(),
            [tables[i]],
            [CONTEXT_LENS[i] - QUERY_LENS[i] + n],
            [n],
            0.125,
        )
        torch.testing.assert_close(out[starts[i] : starts[i] + n], expected, atol=2e-5, rtol=1e-4)
    assert out[~computed].isnan().all()


def test_rejects_rows_outside_the_query_or_its_context():
    query = torch.randn(5, 4, 64)
    cache = torch.randn(4, 16, 2, 64)
    tables = torch.zeros(2, 1, dtype=torch.int32)
    contexts = torch.tensor([3, 2], dtype=torch.int32)
    out = torch.empty(query.shape)
    for starts, lens, error in [
        ([0, 3], torch.tensor([3, 2]), TypeError),  # int64
        ([0], [3], ValueError),  # one sequence short
        ([0, 4], [3, 2], ValueError),  # past the last row
        ([0, 3], [3, 0], ValueError),  # no rows
        ([0, 3], [4, 2], ValueError),  # more rows than context
    ]:
        starts = torch.tensor(starts, dtype=torch.int32)
        lens = lens if isinstance(lens, torch.Tensor) else torch.tensor(lens, dtype=torch.int32)
        with pytest.raises(error, match="query"):
            paged_attention_prefill(out, query, cache, cache, tables, starts, lens, contexts, 1.0)


@pytest.mark.parametrize("march", MARCHES)
@pytest.mark.parametrize("window", [None, 10])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(march, window, num_threads):
    """The last n rows of a 59-token prompt, computed alone (a chunk after cached blocks) or
    with the rest: the same bits whichever tile and register block a row falls in, so a prompt
    continued from the prefix cache gives what the whole prompt gives."""
    torch.manual_seed(0)
    key_cache, value_cache = (torch.randn(16, 8, 2, 16) for _ in range(2))
    block_tables = torch.arange(16, dtype=torch.int32).view(1, -1)
    query = torch.randn(59, 4, 16)
    lens = torch.tensor([59], dtype=torch.int32)

    def last_rows(n: int) -> torch.Tensor:
        rows = query[59 - n :].clone()
        starts, query_lens = query_rows([n])
        args = (key_cache, value_cache, block_tables, starts, query_lens, lens, 0.25)
        args += (num_threads, march)
        return paged_attention_prefill(torch.empty_like(rows), rows, *args, window=window)

    whole = last_rows(59)
    for n in (1, 3, 11, 19, 40):
        assert torch.equal(last_rows(n), whole[59 - n :]), n
