"""The CPU attention kernels, decode (kernels/paged_attention_cpu.c) and prefill
(kernels/prefill_attention_cpu.c), built and loaded by pagedgen.kernels.cpu_build."""

import ctypes
import functools
from types import SimpleNamespace

import torch

from pagedgen.kernels.cpu_build import (
    build_error,
    declare,
    load_amx_library,
    load_cpu_library,
)
from pagedgen.kernels.cpu_features import kernel_march

SOURCE = "paged_attention_cpu.c"
PREFILL_SOURCE = "prefill_attention_cpu.c"
AMX_PREFILL_SOURCE = "prefill_attention_amx.c"
KV_DTYPE_CODES = {
    torch.float32: 0,
    torch.bfloat16: 1,
    torch.float16: 2,
    torch.float8_e4m3fn: 3,
    torch.float8_e5m2: 4,
}
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
ACTIVATION_DTYPES = (torch.float32, torch.bfloat16)  # of query and out


_p, _i64, _i32, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
# The C types of _leading_args and _trailing_args, which both kernels take.
LEADING_TYPES = [_i32, _i32, _p, _p, _i64, _p, _p, _p, _i64]
TRAILING_TYPES = [_i32, _i32, _i32, _i32, _f32, _i32, _f32, _p, _p, _i32]


@functools.cache
def _library(march: str, kv_dtype: int = KV_DTYPE_CODES[torch.float32]) -> SimpleNamespace:
    """The decode kernel built for one cache dtype (a code of KV_DTYPE_CODES): a build of all
    five took ~50 s at -O3, one takes ~10."""
    lib = load_cpu_library(SOURCE, march, (f"-DPAGEDGEN_KV_DTYPE={kv_dtype}",))
    decode = [*LEADING_TYPES, _p, _i64, *TRAILING_TYPES]  # context_lens, num_seqs
    return declare(lib, {"paged_attention_decode": decode, "paged_attention_has_float16": []})


@functools.cache
def _prefill_library(march: str) -> SimpleNamespace:
    lib = load_cpu_library(PREFILL_SOURCE, march)
    # query_starts, query_lens, context_lens, num_seqs
    prefill = [*LEADING_TYPES, _p, _p, _p, _i64, *TRAILING_TYPES]
    return declare(lib, {"paged_attention_prefill": prefill})


@functools.cache
def _amx_prefill_library() -> SimpleNamespace:
    lib = load_amx_library(AMX_PREFILL_SOURCE)
    prefill = [*LEADING_TYPES, _p, _p, _p, _i64, *TRAILING_TYPES]
    return declare(lib, {"paged_attention_prefill_amx": prefill})


def amx_error() -> str | None:
    """None when the AMX prefill kernel (kernels/prefill_attention_amx.c) runs here, else why
    not."""
    return build_error(_amx_prefill_library)


def amx_supports(query: torch.Tensor, key_cache: torch.Tensor) -> bool:
    """Whether the AMX prefill kernel takes these rows: bfloat16 query and cache, head_dim a
    multiple of 16 up to 256 (windows, soft caps, sinks and ALiBi it takes)."""
    head_dim = query.shape[-1]
    bfloat16 = query.dtype == key_cache.dtype == torch.bfloat16
    return bfloat16 and head_dim % 16 == 0 and head_dim <= 256


def cpu_kernel_error(march: str | None = None) -> str | None:
    """None when the kernel compiles and loads here, else why not."""
    march = march or kernel_march()
    return build_error(lambda: _library(march), lambda: _prefill_library(march))


def kernel_dtypes(march: str | None = None) -> tuple[torch.dtype, ...]:
    """The cache dtypes the kernel reads (float16 needs a compiler with _Float16)."""
    return _kernel_dtypes(march or kernel_march())


@functools.cache
def _kernel_dtypes(march: str) -> tuple[torch.dtype, ...]:
    if _library(march).paged_attention_has_float16():
        return (torch.float32, torch.bfloat16, torch.float16, *FP8_DTYPES)
    return (torch.float32, torch.bfloat16, *FP8_DTYPES)


def paged_attention_decode(
    out: torch.Tensor,  # [num_seqs, num_heads, head_dim], contiguous, query's dtype
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim], each row contiguous
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, >= ceil(max context / block_size)] int32
    context_lens: torch.Tensor,  # [num_seqs] int32, every entry >= 1
    scale: float,
    num_threads: int | None = None,
    march: str | None = None,  # the build to run; None: this machine's (see kernel_march)
    window: int | None = None,  # attend to the last `window` tokens only; earlier blocks unread
    softcap: float | None = None,  # scores -> softcap * tanh(scores / softcap)
    sinks: torch.Tensor | None = None,  # [num_heads] float32: a logit in each head's softmax
    # [num_heads] float32: ALiBi, slope * (key position - query position) added to each score
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention of one query row per sequence over its context in the paged cache.

    query and out are float32, or both bfloat16 (computed in float32, out rounded once); the
    caches float32, bfloat16, float16 or float8 (E4M3 or E5M2; see kernel_dtypes)."""
    num_seqs = query.shape[0]
    march = march or kernel_march()
    _check(
        out, query, key_cache, value_cache, block_tables, context_lens, march, sinks, alibi_slopes
    )
    if block_tables.shape[0] < num_seqs or context_lens.shape[0] < num_seqs:
        raise ValueError("one block table and context length per sequence")
    head = _leading_args(out, query, key_cache, value_cache, block_tables)
    options = (window, softcap, sinks, alibi_slopes)
    tail = _trailing_args(query, key_cache, scale, *options, num_threads)
    library = _library(march, KV_DTYPE_CODES[key_cache.dtype])
    status = library.paged_attention_decode(*head, context_lens.data_ptr(), num_seqs, *tail)
    if status != 0:
        raise RuntimeError(f"paged_attention_decode failed with status {status}")
    return out


def paged_attention_prefill(
    out: torch.Tensor,  # [num_tokens, num_heads, head_dim], contiguous, query's dtype
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim], each row contiguous
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], written
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, >= ceil(context / block_size)] int32
    query_starts: torch.Tensor,  # [num_seqs] int32: sequence s's rows are query_starts[s] ..
    query_lens: torch.Tensor,  # [num_seqs] int32: .. + query_lens[s], at the last positions
    context_lens: torch.Tensor,  # [num_seqs] int32: of these contexts
    scale: float,
    num_threads: int | None = None,
    march: str | None = None,
    window: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    amx: bool = False,  # by the AMX kernel, where amx_supports the rows (march unused)
) -> torch.Tensor:
    """Causal attention of prefill rows over their sequences' contexts in the paged cache (this
    step's K/V written already), tiles of query rows sharing each K/V row they load. Dtypes as
    paged_attention_decode's."""
    num_tokens = query.shape[0]
    march = march or kernel_march()
    _check(
        out, query, key_cache, value_cache, block_tables, context_lens, march, sinks, alibi_slopes
    )
    num_seqs = context_lens.shape[0]
    rows = (query_starts, query_lens)
    if any(t.dtype != torch.int32 or not t.is_contiguous() or not t.is_cpu for t in rows):
        raise TypeError("query_starts and query_lens must be contiguous int32 on the CPU")
    if query_starts.shape != (num_seqs,) or query_lens.shape != (num_seqs,):
        raise ValueError("one query start, query length and context length per sequence")
    if block_tables.shape[0] < num_seqs:
        raise ValueError("one block table per sequence")
    if num_seqs and (
        bool((query_starts < 0).any())
        or bool((query_lens < 1).any())
        or bool((query_lens > context_lens).any())
        or int((query_starts + query_lens).max()) > num_tokens
    ):
        raise ValueError(f"query rows outside the {num_tokens} rows or their contexts")
    head = _leading_args(out, query, key_cache, value_cache, block_tables)
    options = (window, softcap, sinks, alibi_slopes)
    tail = _trailing_args(query, key_cache, scale, *options, num_threads)
    lens = (query_starts.data_ptr(), query_lens.data_ptr(), context_lens.data_ptr())
    if amx:
        if not amx_supports(query, key_cache):
            raise ValueError("the AMX prefill kernel takes bfloat16 heads of 16k <= 256")
        kernel = _amx_prefill_library().paged_attention_prefill_amx
    else:
        kernel = _prefill_library(march).paged_attention_prefill
    status = kernel(*head, *lens, num_seqs, *tail)
    if status != 0:
        raise RuntimeError(f"paged_attention_prefill failed with status {status}")
    return out


def _check(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    march: str,
    sinks: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
) -> None:
    """Raises for arguments the kernels cannot take."""
    num_heads, head_dim = query.shape[1:]
    tensors = (out, query, key_cache, value_cache, block_tables, context_lens)
    if not all([t.is_cpu for t in tensors]):
        raise ValueError("the CPU attention kernels run on CPU tensors only")
    if query.dtype != out.dtype or query.dtype not in ACTIVATION_DTYPES:
        raise TypeError(
            f"query and out must be both float32 or both bfloat16, got {query.dtype} and "
            f"{out.dtype}"
        )
    dtypes = kernel_dtypes(march)
    if key_cache.dtype != value_cache.dtype or key_cache.dtype not in dtypes:
        raise TypeError(
            f"caches of {key_cache.dtype} and {value_cache.dtype}; this build reads "
            f"{[str(d) for d in dtypes]}"
        )
    if block_tables.dtype != torch.int32 or context_lens.dtype != torch.int32:
        raise TypeError("block_tables and context_lens must be int32")
    if key_cache.shape[3] != head_dim or value_cache.shape != key_cache.shape:
        raise ValueError(
            f"query {tuple(query.shape)} does not match cache {tuple(key_cache.shape)}"
        )
    if out.shape != query.shape or not out.is_contiguous():
        raise ValueError("out must be contiguous and shaped like query")
    if query.stride()[1:] != (head_dim, 1):
        raise ValueError("each query row must be contiguous")
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("the caches must be contiguous")
    if block_tables.stride(1) != 1 or not context_lens.is_contiguous():
        raise ValueError("block_tables rows and context_lens must be contiguous")
    for name, per_head in (("sinks", sinks), ("alibi_slopes", alibi_slopes)):
        if per_head is not None and (
            per_head.shape != (num_heads,)
            or per_head.dtype != torch.float32
            or not (per_head.is_cpu and per_head.is_contiguous())
        ):
            raise ValueError(f"{name} must be {num_heads} contiguous float32 on the CPU")


def _leading_args(out, query, key_cache, value_cache, block_tables) -> tuple:
    """The arguments both kernels start with: dtypes, tensors, strides."""
    kv_dtype, act_bf16 = KV_DTYPE_CODES[key_cache.dtype], int(query.dtype == torch.bfloat16)
    tensors = (out.data_ptr(), query.data_ptr(), query.stride(0))
    cache = (key_cache.data_ptr(), value_cache.data_ptr())
    return (kv_dtype, act_bf16, *tensors, *cache, block_tables.data_ptr(), block_tables.stride(0))


def _trailing_args(
    query, key_cache, scale, window, softcap, sinks, alibi_slopes, num_threads
) -> tuple:
    """The arguments both kernels end with: shapes, scale, window, soft cap, sinks, ALiBi
    slopes, threads."""
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    shapes = (query.shape[1], num_kv_heads, head_dim, block_size)
    per_head = [None if t is None else t.data_ptr() for t in (sinks, alibi_slopes)]
    options = (window or 0, softcap or 0.0, *per_head, num_threads or torch.get_num_threads())
    return (*shapes, scale, *options)
