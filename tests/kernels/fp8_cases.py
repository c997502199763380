"""fp8 KV caches: the values that exercise the kernels' conversions, and the checks that the
emulation, mutation and GPU tests share. A write (reshape_and_cache) must store exactly the bytes
of to_cache_dtype; a read (each attention kernel, over a one-token context whose value holds all
256 codes) must return exactly torch's widening of every code; and so must common.cuh's
conversions on their own, in the emulator."""

from collections.abc import Callable

import numpy as np
import torch

from pagedgen.attention.kv_cache_dtype import to_cache_dtype
from pagedgen.kernels.cache_ops import reshape_and_cache_launch
from pagedgen.kernels.launch import KernelLaunch, KernelModule
from pagedgen.kernels.paged_attention import paged_attention_launches
from pagedgen.kernels.prefill_attention import prefill_attention_launch
from tests.kernels.emulator import Emulator
from tests.kernels.paged_cases import FP8_DTYPES

Launcher = Callable[[KernelLaunch], None]
READ_KERNELS = ("decode_v1", "decode_v2", "grouped_v1", "grouped_v2", "prefill")
TOKEN_SIZE = 256  # one kv head of 256: a token's value holds every code once


def every_value(dtype: torch.dtype) -> torch.Tensor:
    """All 65536 bit patterns of a 16-bit dtype: NaNs, infinities and subnormals included."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)


def hard_floats(seed: int = 0) -> torch.Tensor:
    """float32 values where rounding to fp8 can go wrong, for both formats: every fp8 value, every
    midpoint of two neighbours (ties), one float ulp either side of each, the same negated; the
    saturation bounds and what lies past them; zeros, infinities, NaNs and float subnormals; and
    random values over 80 binades."""
    points = []
    for dtype in FP8_DTYPES:
        values = torch.arange(256, dtype=torch.uint8).view(dtype).float()
        values = values[values.isfinite() & (values >= 0)].sort().values
        points += [values, (values[1:] + values[:-1]) / 2]
        top = values[-1]
        points.append(torch.stack([top + (top - values[-2]) / 2, top * 2, top * 1e3]))
    x = torch.cat(points)
    x = torch.cat([x, x.nextafter(torch.tensor(float("inf"))), x.nextafter(torch.tensor(0.0))])
    special = [0.0, float("inf"), float("nan"), 1e-45, 1e-40, 1.1754942e-38, 3.4028235e38, 2**-30]
    g = torch.Generator().manual_seed(seed)
    scales = torch.exp2(torch.randint(-40, 40, (20000,), generator=g).float())
    x = torch.cat([x, torch.tensor(special), torch.randn(20000, generator=g) * scales])
    return torch.cat([x, -x])


def write_values(dtype: torch.dtype) -> torch.Tensor:
    return hard_floats() if dtype == torch.float32 else every_value(dtype)


def bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.uint8)


def check_writes(
    launch: Launcher, dtype: torch.dtype, cache_dtype: torch.dtype, device: str = "cpu"
) -> None:
    """reshape_and_cache of write_values(dtype) as keys, and of them reversed as values, into
    scattered slots: each stored byte must be to_cache_dtype's."""
    x = write_values(dtype)
    num_tokens = -(-x.numel() // TOKEN_SIZE)
    key = torch.zeros(num_tokens * TOKEN_SIZE, dtype=dtype)
    key[: x.numel()] = x
    key = key.view(num_tokens, 1, TOKEN_SIZE)
    value = key.flip(0)
    block_size, num_blocks = 16, num_tokens // 16 + 2
    shape = (num_blocks, block_size, 1, TOKEN_SIZE)
    key_cache = torch.zeros(shape, dtype=torch.uint8).view(cache_dtype).to(device)
    value_cache = torch.zeros(shape, dtype=torch.uint8).view(cache_dtype).to(device)
    g = torch.Generator().manual_seed(num_tokens)
    slot_mapping = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    plan = reshape_and_cache_launch(
        key.to(device), value.to(device), key_cache, value_cache, slot_mapping.to(device)
    )
    assert plan is not None
    launch(plan)
    for cache, written in ((key_cache, key), (value_cache, value)):
        stored = bytes_of(cache).view(-1, TOKEN_SIZE)[slot_mapping]
        expected = bytes_of(to_cache_dtype(written, cache_dtype)).view(-1, TOKEN_SIZE)
        mismatch = (stored != expected).nonzero()
        assert mismatch.numel() == 0, [
            (written.view(-1, TOKEN_SIZE)[i, j].item(), hex(stored[i, j]), hex(expected[i, j]))
            for i, j in mismatch[:8].tolist()
        ]


def check_reads(
    launch: Launcher,
    kernel: str,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    device: str = "cpu",
) -> None:
    """One sequence of one token whose value holds every code: with a zero key (and query) its
    softmax weight is exactly 1, so the output is the value as the kernel reads it."""
    assert kernel in READ_KERNELS, kernel
    codes = torch.arange(256, dtype=torch.uint8).view(cache_dtype)
    shape = (2, 16, 1, TOKEN_SIZE)
    key_cache = torch.zeros(shape, dtype=torch.uint8).view(cache_dtype).to(device)
    value_cache = torch.zeros(shape, dtype=torch.uint8).view(cache_dtype)
    value_cache[1, 0, 0] = codes
    value_cache = value_cache.to(device)
    num_heads = 2 if kernel.startswith("grouped") else 1  # the grouped kernel takes GQA only
    query = torch.zeros(1, num_heads, TOKEN_SIZE, dtype=dtype, device=device)
    out = torch.full_like(query, 7.0)
    block_tables = torch.ones(1, 1, dtype=torch.int32, device=device)
    context_lens = torch.ones(1, dtype=torch.int32, device=device)
    if kernel == "prefill":
        cu_seqlens_q = torch.tensor([0, 1], dtype=torch.int32, device=device)
        args = (block_tables, cu_seqlens_q, context_lens, 1, 1.0)
        plans = [prefill_attention_launch(out, query, key_cache, value_cache, *args)]
    else:
        plans = paged_attention_launches(
            out,
            query,
            key_cache,
            value_cache,
            block_tables,
            context_lens,
            1,
            1.0,
            version=int(kernel[-1]),
            partition_size=64,
            grouped=kernel.startswith("grouped"),
        )
    for plan in plans:
        assert plan is not None
        launch(plan)
    expected = codes.float().to(dtype).expand(num_heads, -1)
    # Exact, NaN for NaN (only the sign of zero may differ: outputs are sums that start at +0).
    torch.testing.assert_close(out[0].cpu(), expected, atol=0, rtol=0, equal_nan=True)


# kernels/common.cuh's conversions on their own, one thread block of a warp over n values: the
# exhaustive checks of conversions_match_torch, and of the bugs planted in its text.
CONVERSION_KERNELS = r"""
namespace pagedgen {
template <typename F>
__global__ void write_fp8(unsigned char* out, const float* x, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = from_float<F>(x[i]).bits;
}
template <typename F>
__global__ void read_fp8(float* out, const unsigned char* codes, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = to_float(F{codes[i]});
}
}  // namespace pagedgen
"""
FP8_TYPES = {torch.float8_e4m3fn: "pagedgen::fp8_e4m3", torch.float8_e5m2: "pagedgen::fp8_e5m2"}
CONVERSIONS = KernelModule(
    "conversions",
    (),
    tuple(f"pagedgen::{k}<{t}>" for k in ("write_fp8", "read_fp8") for t in FP8_TYPES.values()),
)


def check_conversions(common_source: str) -> None:
    """Writes of every bfloat16 and float16 value and of hard_floats() are to_cache_dtype's bytes,
    and reads of every code are torch's widening, bit for bit (NaN for NaN), in both formats."""
    names = list(CONVERSIONS.name_expressions)
    emulator = Emulator(common_source + CONVERSION_KERNELS, names)
    x = torch.cat(
        [hard_floats(), *(every_value(d).float() for d in (torch.bfloat16, torch.float16))]
    )
    codes = torch.arange(256, dtype=torch.uint8)
    for dtype, c_type in FP8_TYPES.items():
        written = torch.zeros(x.numel(), dtype=torch.uint8)
        args = (written, x, np.int32(x.numel()))
        write = f"pagedgen::write_fp8<{c_type}>"
        emulator.launch(KernelLaunch(CONVERSIONS, write, (1, 1, 1), (32, 1, 1), args))
        expected = to_cache_dtype(x, dtype).view(torch.uint8)
        wrong = (written != expected).nonzero().flatten()[:8].tolist()
        assert not wrong, [(x[i].item(), hex(written[i]), hex(expected[i])) for i in wrong]

        read = torch.zeros(256)
        args = (read, codes, np.int32(256))
        name = f"pagedgen::read_fp8<{c_type}>"
        emulator.launch(KernelLaunch(CONVERSIONS, name, (1, 1, 1), (32, 1, 1), args))
        widened = codes.view(dtype).float()
        same = (read.view(torch.int32) == widened.view(torch.int32)) | (
            read.isnan() & widened.isnan()
        )
        assert same.all(), [(hex(c), read[c].item(), widened[c].item()) for c in (~same).nonzero()]
