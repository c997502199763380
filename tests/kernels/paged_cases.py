"""Random decode batches over a scattered, NaN-poisoned paged cache, and the check against the
torch reference; shared by the emulation, mutation and GPU tests."""

import math
import random
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch

from pagedgen.attention.kv_cache_dtype import is_fp8, to_cache_dtype
from pagedgen.attention.metadata import AttentionMetadata
from pagedgen.attention.reference import paged_attention_reference
from pagedgen.kernels.decode_tuning import DEFAULT_TUNING, DecodeTuning
from pagedgen.kernels.launch import KernelLaunch
from pagedgen.kernels.paged_attention import PARTITION_SIZE, paged_attention_launches

CONTEXT_LENS = (1, 15, 16, 17, 100, 257)


def requires_gpu(min_compute_capability: tuple[int, int] = (0, 0)) -> list[pytest.MarkDecorator]:
    """The marks of a GPU test module: gpu, and skipped without a CUDA GPU of at least that
    compute capability and CuPy (kernels that need a newer GPU than it fall back to others)."""
    from pagedgen.kernels import loader

    have_gpu = torch.cuda.is_available() and loader.cupy_available()
    too_old = have_gpu and torch.cuda.get_device_capability() < min_compute_capability
    return [
        pytest.mark.gpu,
        pytest.mark.skipif(not have_gpu, reason="needs a CUDA GPU and CuPy (pagedgen[cuda])"),
        pytest.mark.skipif(too_old, reason=f"needs sm_{''.join(map(str, min_compute_capability))}"),
    ]


# Small enough that the longer contexts above span several partitions.
SMALL_PARTITION_SIZE = 64
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# Both sides read the same rounded inputs (an fp8 cache dequantized exactly) and accumulate in
# float; they differ in the order of the sums and, for half types, by at most an output rounding
# step.
TOLERANCES = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def bloom_alibi_slopes(num_heads: int, seed: int = 0) -> torch.Tensor:
    """BLOOM's ALiBi slopes (2^-1 .. 2^-8 for 8 heads; more heads interleave a finer series)
    in a random head order, so a kernel reading another head's slope gets a very different one.
    """
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = [2 ** (-8 * (i + 1) / closest) for i in range(closest)]
    slopes += [2 ** (-4 * (2 * i + 1) / closest) for i in range(num_heads - closest)]
    order = torch.randperm(num_heads, generator=torch.Generator().manual_seed(seed))
    return torch.tensor(slopes, dtype=torch.float32)[order]


class DecodeCase(NamedTuple):
    query: torch.Tensor  # [num_seqs, num_heads, head_size]
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks_per_seq] int32, padded with 0
    context_lens: torch.Tensor  # [num_seqs] int32
    block_table_lists: list[list[int]]
    scale: float
    window: int | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None  # [num_heads] float32
    alibi_slopes: torch.Tensor | None = None  # [num_heads] float32

    @property
    def max_context_len(self) -> int:
        return int(self.context_lens.max())


def make_decode_case(
    dtype: torch.dtype,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    context_lens: tuple[int, ...] = CONTEXT_LENS,
    seed: int = 0,
    device: str = "cpu",
    cache_dtype: torch.dtype | None = None,  # None: dtype
    window: int | None = None,
    softcap: float | None = None,
    sinks: bool = False,  # gpt-oss's: one logit per head, from well below to well above a score
    alibi: bool = False,  # BLOOM's slopes, shuffled over the heads
) -> DecodeCase:
    """Each sequence gets randomly chosen blocks; every slot it does not own stays NaN.

    Block 0 is never handed out, and the block tables are padded with 0, so a kernel that reads
    one token or one block too far reads NaN and the result shows it. With a window, the entries
    of blocks wholly before it point at block 0 too (the engine frees them) and their tokens are
    NaN. The cache is filled in float32, then rounded to cache_dtype as the backends write it.
    """
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    num_blocks = sum(blocks_per_seq) + 4
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache = torch.full(shape, float("nan"))
    value_cache = torch.full(shape, float("nan"))
    free_blocks = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    block_table_lists, kernel_tables = [], []
    for context_len, num_seq_blocks in zip(context_lens, blocks_per_seq):
        block_table = [free_blocks.pop() for _ in range(num_seq_blocks)]
        block_table_lists.append(block_table)
        first = 0 if window is None else max(0, context_len - window) // block_size
        kernel_tables.append([0] * first + block_table[first:])
        positions = torch.arange(context_len)
        slots = torch.tensor(block_table)[positions // block_size] * block_size
        slots += positions % block_size
        for cache in (key_cache, value_cache):
            values = torch.randn(context_len, num_kv_heads, head_size, generator=g)
            values[: first * block_size] = float("nan")
            cache.view(-1, num_kv_heads, head_size)[slots] = values
    key_cache, value_cache = (
        to_cache_dtype(c, cache_dtype or dtype) for c in (key_cache, value_cache)
    )
    max_blocks = max(blocks_per_seq)
    block_tables = torch.tensor(
        [table + [0] * (max_blocks - len(table)) for table in kernel_tables], dtype=torch.int32
    )
    # Doubled queries make the softmax peakier, so a missed rescale cannot hide in the noise.
    query = 2 * torch.randn(len(context_lens), num_heads, head_size, generator=g)
    return DecodeCase(
        query.to(dtype).to(device),
        key_cache.to(device),
        value_cache.to(device),
        block_tables.to(device),
        torch.tensor(context_lens, dtype=torch.int32, device=device),
        block_table_lists,
        head_size**-0.5,
        window,
        softcap,
        torch.linspace(-6.0, 6.0, num_heads, device=device) if sinks else None,
        bloom_alibi_slopes(num_heads, seed).to(device) if alibi else None,
    )


def dequantized(cache: torch.Tensor) -> torch.Tensor:
    """The cache as attention must see it: an fp8 one widened (exactly) to float32."""
    return cache.cpu().float() if is_fp8(cache.dtype) else cache.cpu()


def reference(case: DecodeCase) -> torch.Tensor:
    return paged_attention_reference(
        case.query.cpu(),
        dequantized(case.key_cache),
        dequantized(case.value_cache),
        case.block_table_lists,
        case.context_lens.tolist(),
        [1] * case.query.shape[0],
        case.scale,
        case.window,
        case.softcap,
        None if case.sinks is None else case.sinks.cpu(),
        None if case.alibi_slopes is None else case.alibi_slopes.cpu(),
    )


def decode_launches(
    case: DecodeCase,
    out: torch.Tensor,
    version: int | None,
    partition_size: int | None = PARTITION_SIZE,
    query: torch.Tensor | None = None,
    grouped: bool = False,
    l2_prefetch: bool = False,
    tuning: DecodeTuning = DEFAULT_TUNING,
    tensor_cores: bool = False,
    seq_order: torch.Tensor | None = None,
) -> list[KernelLaunch]:
    """The case's decode planned into out (query: the case's by default)."""
    return paged_attention_launches(
        out,
        case.query if query is None else query,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        case.context_lens,
        case.max_context_len,
        case.scale,
        version=version,
        partition_size=partition_size,
        grouped=grouped,
        l2_prefetch=l2_prefetch,
        tuning=tuning,
        tensor_cores=tensor_cores,
        window=case.window,
        softcap=case.softcap,
        sinks=case.sinks,
        alibi_slopes=case.alibi_slopes,
        seq_order=seq_order,
    )


def run_decode(
    launch: Callable[[KernelLaunch], None],
    case: DecodeCase,
    version: int | None,
    partition_size: int = PARTITION_SIZE,
    query: torch.Tensor | None = None,
    grouped: bool = False,
    l2_prefetch: bool = False,
    tensor_cores: bool = False,
    seq_order: torch.Tensor | None = None,
) -> torch.Tensor:
    out = torch.full_like(case.query, float("nan"))
    launches = decode_launches(
        case, out, version, partition_size, query, grouped, l2_prefetch,
        tensor_cores=tensor_cores, seq_order=seq_order,
    )  # fmt: skip
    # The planner's float scratch (v2's partials and stats) starts as NaN: a kernel that reads a
    # partial before its partition wrote it shows, whatever the allocator handed out.
    inputs = {id(t) for t in (out, query, *case) if isinstance(t, torch.Tensor)}
    for kernel_launch in launches:
        for arg in kernel_launch.args:
            if isinstance(arg, torch.Tensor) and arg.is_floating_point() and id(arg) not in inputs:
                arg.fill_(float("nan"))
    for kernel_launch in launches:
        launch(kernel_launch)
    return out


def check_decode(
    launch: Callable[[KernelLaunch], None],
    case: DecodeCase,
    version: int | None,
    partition_size: int = PARTITION_SIZE,
    grouped: bool = False,
    l2_prefetch: bool = False,
    tensor_cores: bool = False,
    seq_order: torch.Tensor | None = None,
) -> None:
    """Runs the kernels through launch and asserts they match the reference (NaN never does)."""
    out = run_decode(
        launch, case, version, partition_size, grouped=grouped, l2_prefetch=l2_prefetch,
        tensor_cores=tensor_cores, seq_order=seq_order,
    )  # fmt: skip
    tolerance = TOLERANCES[case.query.dtype]
    torch.testing.assert_close(
        out.cpu().float(), reference(case).float(), atol=tolerance, rtol=tolerance
    )


def make_metadata(
    query_lens: list[int], context_lens: list[int], block_size: int, num_blocks: int, device: str
) -> AttentionMetadata:
    """Scattered block tables; the same ones for every device."""
    rng = random.Random(0)
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables, slots = [], []
    for query_len, context_len in zip(query_lens, context_lens):
        table = [free.pop() for _ in range(-(-context_len // block_size))]
        tables.append(table)
        positions = range(context_len - query_len, context_len)
        slots += [table[p // block_size] * block_size + p % block_size for p in positions]
    width = max(len(table) for table in tables)
    cu_seqlens = [0]
    for query_len in query_lens:
        cu_seqlens.append(cu_seqlens[-1] + query_len)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=device),
        cu_seqlens_q=torch.tensor(cu_seqlens, dtype=torch.int32, device=device),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(
            [t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device
        ),
        max_seqlen_q=max(query_lens),
        max_context_len=max(context_lens),
        block_size=block_size,
        num_decode_seqs=next((i for i, q in enumerate(query_lens) if q != 1), len(query_lens)),
        query_lens_cpu=query_lens,
        context_lens_cpu=context_lens,
    )


def backend_decode_kernels(monkeypatch, option: str) -> list[str]:
    """The kernels that CupyAttentionBackend launches on the GPU for a small float16 GQA decode
    batch with its CudaAttentionConfig option set True."""
    from pagedgen.attention import cupy_backend
    from pagedgen.attention.spec import AttentionSpec
    from pagedgen.config import CudaAttentionConfig
    from pagedgen.kernels import loader

    names = []
    launch = loader.launch
    monkeypatch.setattr(loader, "launch", lambda k: names.append(k.name_expression) or launch(k))
    case = make_decode_case(torch.float16, 8, 2, 128, 16, context_lens=(5, 40), device="cuda")
    out = torch.empty_like(case.query)
    options = CudaAttentionConfig(**{option: True})
    backend = cupy_backend.CupyAttentionBackend(torch.device("cuda"), 128, 16, options)
    metadata = make_metadata([1, 1], [5, 40], 16, case.key_cache.shape[0], "cuda")
    spec = AttentionSpec(8, 2, 128, case.scale)
    backend.decode(spec, case.query, case.key_cache, case.value_cache, metadata, out)
    return names
