"""kernels/rms_norm.cu, silu_and_mul.cu and rope_and_cache.cu on the CPU against the torch ops
they replace (RMSNorm's torch path, F.silu(gate) * up, Rope.apply + the cache write, into caches
of the activations' dtype or fp8), and planted bugs in each that those checks must catch."""

import functools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from pagedgen.attention.reference import write_kv_reference
from pagedgen.kernels.launch import KernelLaunch, KernelModule
from pagedgen.kernels.layer_ops import rms_norm_launch, rope_and_cache_launch, silu_and_mul_launch
from pagedgen.kernels.source import kernel_source
from pagedgen.layers.norm import RMSNorm
from pagedgen.layers.rotary import Rope
from tests.kernels.emulator import Emulator, have_gxx
from tests.kernels.paged_cases import DTYPES, FP8_DTYPES

pytestmark = pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation")
# bfloat16 and float16: one unit in the last place of values of magnitude ~4
ULP = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3.2e-2}


@functools.cache
def emulator(module: KernelModule, source: str | None = None) -> Emulator:
    source = source or kernel_source(module.source)
    return Emulator(source, list(module.name_expressions), module.defines)


Launcher = Callable[[KernelLaunch], None]


def emulated(source: str | None = None) -> Launcher:
    """Runs launches on the CPU emulator, of the module's source or of the given text."""
    return lambda launch: emulator(launch.module, source).launch(launch)


def run(launcher: Launcher, launch: KernelLaunch | None) -> None:
    assert launch is not None
    launcher(launch)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def check_rms_norm(dtype: torch.dtype, launcher: Launcher, device: str = "cpu") -> None:
    """Rows of 200 (16-byte vectors in every dtype) and of 201 (one element a thread)."""
    for hidden in (200, 201):
        check_rms_norm_rows(dtype, launcher, device, hidden)


def check_rms_norm_rows(dtype: torch.dtype, launcher: Launcher, device: str, hidden: int) -> None:
    num_tokens, eps = 7, 1e-5  # hidden not a multiple of the block
    norm = RMSNorm(hidden, eps).to(device, dtype)
    norm.weight.copy_(torch.randn(hidden))
    x = torch.randn(num_tokens, 2 * hidden).to(device, dtype)[:, :hidden]  # rows strided
    out = torch.full((num_tokens, hidden), float("nan"), dtype=dtype, device=device)
    run(launcher, rms_norm_launch(out, x, norm.weight, eps))
    torch.testing.assert_close(out, norm._norm(x.contiguous()), atol=ULP[dtype], rtol=ULP[dtype])

    sublayer = torch.randn(num_tokens, hidden).to(device, dtype)
    residual = torch.randn(num_tokens, hidden).to(device, dtype)
    expected_residual = residual + sublayer
    expected = norm._norm(expected_residual)
    run(launcher, rms_norm_launch(sublayer, sublayer, norm.weight, eps, residual))  # in place
    assert torch.equal(bits(residual), bits(expected_residual))
    torch.testing.assert_close(sublayer, expected, atol=ULP[dtype], rtol=ULP[dtype])


def check_silu_and_mul(dtype: torch.dtype, launcher: Launcher, device: str = "cpu") -> None:
    """Rows of 296 (16-byte vectors in every dtype) and of 301 (one element a thread)."""
    for d in (296, 301):
        gate_up = (3 * torch.randn(9, 2 * d)).to(device, dtype)
        out = torch.full((9, d), float("nan"), dtype=dtype, device=device)
        run(launcher, silu_and_mul_launch(out, gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        torch.testing.assert_close(out, F.silu(gate) * up, atol=ULP[dtype], rtol=ULP[dtype])


def check_rope_and_cache(
    dtype: torch.dtype,
    launcher: Launcher,
    device: str = "cpu",
    cache_dtype: torch.dtype | None = None,  # None: dtype
) -> None:
    """Heads of 64 (16-byte vectors in every dtype) and of 36 (one element a thread). Into an
    fp8 cache, the projection is scaled so that E4M3's keys and values saturate too."""
    for head_size in (64, 36):
        check_rope_and_cache_heads(dtype, launcher, device, cache_dtype or dtype, head_size)


def check_rope_and_cache_heads(
    dtype: torch.dtype,
    launcher: Launcher,
    device: str,
    cache_dtype: torch.dtype,
    head_size: int,
) -> None:
    num_tokens, num_heads, num_kv_heads, block_size, num_blocks = 11, 6, 2, 16, 5
    width = (num_heads + 2 * num_kv_heads) * head_size
    scale = 1 if cache_dtype == dtype else 300
    qkv = (scale * torch.randn(num_tokens, width + 32)).to(device, dtype)[:, :width]  # strided
    angles = torch.rand(num_tokens, head_size // 2, device=device) * 6.3
    rope = Rope(angles.cos().unsqueeze(1), angles.sin().unsqueeze(1))
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    key_cache, value_cache = (
        torch.randn(shape).to(device, cache_dtype),
        torch.randn(shape).to(device, cache_dtype),
    )
    slot_mapping = torch.randperm(num_blocks * block_size)[:num_tokens].to(device)
    slot_mapping[::4] = -1

    q, k, v = qkv.split([num_heads * head_size, *[num_kv_heads * head_size] * 2], dim=-1)
    expected_query = rope.apply(q.unflatten(1, (num_heads, head_size)))
    expected_key = rope.apply(k.unflatten(1, (num_kv_heads, head_size)))
    expected_value = v.unflatten(1, (num_kv_heads, head_size)).clone()
    expected_key_cache, expected_value_cache = key_cache.cpu().clone(), value_cache.cpu().clone()
    write_kv_reference(  # rounds the roped key, in dtype, to an fp8 cache's dtype
        expected_key.cpu(),
        expected_value.cpu(),
        expected_key_cache,
        expected_value_cache,
        slot_mapping.cpu(),
    )

    query = torch.full((num_tokens, num_heads, head_size), float("nan"), dtype=dtype, device=device)
    cos, sin = rope.cos.flatten(1), rope.sin.flatten(1)
    run(launcher, rope_and_cache_launch(query, qkv, key_cache, value_cache, cos, sin, slot_mapping))
    # Each product and sum rounds once, as torch's ops do: bit for bit.
    assert torch.equal(bits(query), bits(expected_query))
    assert torch.equal(bits(qkv[:, num_heads * head_size :][:, : num_kv_heads * head_size]),
                       bits(expected_key.flatten(1)))  # fmt: skip
    assert torch.equal(bits(key_cache.cpu()), bits(expected_key_cache))
    assert torch.equal(bits(value_cache.cpu()), bits(expected_value_cache))


CHECKS = {
    "rms_norm.cu": check_rms_norm,
    "silu_and_mul.cu": check_silu_and_mul,
    "rope_and_cache.cu": check_rope_and_cache,
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("source", CHECKS)
def test_layer_op_matches_torch(source: str, dtype: torch.dtype) -> None:
    CHECKS[source](dtype, emulated())


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_and_cache_into_fp8(dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    check_rope_and_cache(dtype, emulated(), cache_dtype=cache_dtype)


def test_empty_batches_launch_nothing() -> None:
    weight = torch.ones(8)
    assert rms_norm_launch(torch.empty(0, 8), torch.empty(0, 8), weight, 1e-6) is None
    assert silu_and_mul_launch(torch.empty(0, 4), torch.empty(0, 8)) is None


def test_launch_plans_reject_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="weight"):
        rms_norm_launch(torch.empty(2, 8), torch.empty(2, 8), torch.ones(9), 1e-6)
    with pytest.raises(ValueError, match="gate_up"):
        silu_and_mul_launch(torch.empty(2, 4), torch.empty(2, 6))
    cache = torch.zeros(2, 16, 1, 64)
    with pytest.raises(ValueError, match="qkv"):
        rope_and_cache_launch(torch.empty(3, 2, 64), torch.empty(3, 64 * 5), cache, cache,
                              torch.empty(3, 32), torch.empty(3, 32),
                              torch.zeros(3, dtype=torch.int64))  # fmt: skip


# name: (source, original text, planted bug)
MUTATIONS = {
    "norm_mean_over_block_not_hidden": (
        "rms_norm.cu",
        "rsqrtf(block_sum(sum) / hidden + eps)",
        "rsqrtf(block_sum(sum) / blockDim.x + eps)",
    ),
    "norm_missing_syncthreads": ("rms_norm.cu", "  __syncthreads();\n", "\n"),
    "norm_only_first_warp": (
        "rms_norm.cu",
        "x = lane < static_cast<int>(blockDim.x / kWarpSize) ? partials[lane] : 0.f;",
        "x = lane < 1 ? partials[lane] : 0.f;",
    ),
    "norm_residual_not_stored": ("rms_norm.cu", "      residual_row[i] = v;\n", "\n"),
    "norm_vector_weight_from_first": (
        "rms_norm.cu",
        "const V w = weights[i];",
        "const V w = weights[0];",
    ),
    "silu_gate_up_swapped": (
        "silu_and_mul.cu",
        "silu_mul(g.data[j], u.data[j])",
        "silu_mul(u.data[j], g.data[j])",
    ),
    "silu_vector_tail_skipped": (
        "silu_and_mul.cu",
        "i < d / kVec; i += blockDim.x",
        "i < d / kVec - 1; i += blockDim.x",
    ),
    "rope_sign": (
        "rope_and_cache.cu",
        "__fsub_rn(__fmul_rn(x1, c.data[j]), __fmul_rn(x2, s.data[j]))",
        "__fadd_rn(__fmul_rn(x1, c.data[j]), __fmul_rn(x2, s.data[j]))",
    ),
    "rope_second_half_by_elements": (
        "rope_and_cache.cu",
        "const V a = x[i], b = x[i + half_vecs];",
        "const V a = x[i], b = x[i + half];",
    ),
    "rope_key_not_cached": (
        "rope_and_cache.cu",
        "        k[i + half_vecs] = k2;\n",
        "\n",
    ),
    "rope_value_from_key": (
        "rope_and_cache.cu",
        "row + (num_heads + num_kv_heads) * head_size);",
        "row + num_heads * head_size);",
    ),
    "rope_value_row": (
        "rope_and_cache.cu",
        "const V v = value[i];",
        "const V v = reinterpret_cast<const V*>(row)[i];",
    ),
    "rope_value_tail_skipped": (
        "rope_and_cache.cu",
        "i < token_size / kVec; i += blockDim.x",
        "i < token_size / kVec - 1; i += blockDim.x",
    ),
    # Into an fp8 cache the roped key must round to T first, then to fp8 (the torch path's
    # to_cache_dtype(rope(k))): rounding the float result straight to fp8 differs on ~1/64 of them.
    "rope_key_rounded_once": (
        "rope_and_cache.cu",
        "k1.data[j] = to_cache<CACHE_T>(y1.data[j]);",
        "k1.data[j] = to_cache<CACHE_T>(__fsub_rn(__fmul_rn(to_float(a.data[j]), c.data[j]), "
        "__fmul_rn(to_float(b.data[j]), s.data[j])));",
    ),
}


def checked_with(name: str) -> list[tuple[torch.dtype, torch.dtype | None]]:
    """The (dtype, cache dtype) checks that a planted bug must fail, each of them: float32 and
    bfloat16 into caches of their dtype and, for rope_and_cache, into E4M3 ones too; the fp8
    rounding bug, invisible where T is float32, in the 16-bit types into E4M3."""
    if name == "rope_key_rounded_once":
        return [(dtype, torch.float8_e4m3fn) for dtype in (torch.float16, torch.bfloat16)]
    caches = [None, torch.float8_e4m3fn] if MUTATIONS[name][0] == "rope_and_cache.cu" else [None]
    return [(dtype, cache) for dtype in (torch.float32, torch.bfloat16) for cache in caches]


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_planted_bug_is_caught(name: str) -> None:
    source, original, planted = MUTATIONS[name]
    text = kernel_source(source)
    assert text.count(original) == 1, f"{name}: the text to mutate is gone from {source}"
    mutated = text.replace(original, planted)
    for dtype, cache_dtype in checked_with(name):
        kwargs = {} if cache_dtype is None else {"cache_dtype": cache_dtype}
        try:
            CHECKS[source](dtype, emulated(mutated), **kwargs)
        except (AssertionError, RuntimeError):
            continue
        pytest.fail(f"{name} went unnoticed in {dtype} into a {cache_dtype or dtype} cache")
