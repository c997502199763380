"""The fused elementwise C ops (kernels/cpu_ops.c) against the torch ops they replace, for every
build a machine of ours may run."""

import pytest
import torch
import torch.nn.functional as F

from pagedgen.attention.torch_backend import write_kv
from pagedgen.kernels import cpu_ops
from pagedgen.layers.norm import RMSNorm
from pagedgen.layers.rotary import Rope
from tests.kernels.cpu.test_paged_attention import MARCHES

pytestmark = pytest.mark.skipif(
    cpu_ops.cpu_ops_error() is not None, reason=f"no CPU ops: {cpu_ops.cpu_ops_error()}"
)
TINY = torch.finfo(torch.float32).tiny
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
ROWS = [1, 7, 300]
ACTIVATION_DTYPES = [
    torch.float32,
    torch.bfloat16,
]  # 300 x 576 crosses the size at which the ops go parallel


@pytest.fixture(params=MARCHES)
def march(request, monkeypatch):
    monkeypatch.setattr(cpu_ops, "kernel_march", lambda: request.param)
    assert cpu_ops.cpu_ops_error(request.param) is None
    return request.param


def assert_close_activations(out: torch.Tensor, ref: torch.Tensor) -> None:
    """float32: within a few ulp (our sum of squares is reassociated). bfloat16: the same values
    but for the rare element whose float32 result sat on a rounding boundary, off by an ulp that
    a second rounding (normed row, then times the weight) may double."""
    assert out.dtype == ref.dtype
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=2e-6, atol=1e-6)
        return
    torch.testing.assert_close(out.float(), ref.float(), rtol=2**-6, atol=1e-6)
    assert (out == ref).float().mean() > 0.99


@pytest.mark.parametrize("dtype", ACTIVATION_DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_rms_norm(march, rows, dtype):
    torch.manual_seed(rows)
    wide = (torch.randn(rows, 700) * 3).to(dtype)
    x = wide[:, 50:626]  # rows 700 apart
    norm = RMSNorm(576, 1e-5).to(dtype)
    norm.weight.data = torch.randn(576).to(dtype)
    out = cpu_ops.rms_norm(x, norm.weight, 1e-5)
    assert_close_activations(out, norm._norm(x))  # the torch path the op replaces


@pytest.mark.parametrize("dtype", ACTIVATION_DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_fused_add_rms_norm(march, rows, dtype):
    torch.manual_seed(rows)
    x, residual = torch.randn(rows, 576).to(dtype), (torch.randn(rows, 576) * 4).to(dtype)
    norm = RMSNorm(576, 1e-6).to(dtype)
    norm.weight.data = torch.randn(576).to(dtype)
    expected_residual = residual + x
    expected = norm._norm(expected_residual)
    cpu_ops.fused_add_rms_norm(x, residual, norm.weight, 1e-6)
    assert torch.equal(residual, expected_residual)
    assert_close_activations(x, expected)


@pytest.mark.parametrize("dtype", ACTIVATION_DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_silu_and_mul(march, rows, dtype):
    torch.manual_seed(rows)
    gate_up = torch.randn(rows, 2 * 1536) * 8
    gate_up[0, :6] = torch.tensor([-200.0, -100.0, -88.0, 0.0, 88.0, 200.0])
    gate_up = gate_up.to(dtype)
    out = cpu_ops.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    assert_close_activations(out, F.silu(gate) * up)
    # torch's silu(-100) is a subnormal, which slows every op it reaches; ours never is one.
    assert not ((out != 0) & (out.float().abs() < TINY)).any()


@pytest.mark.parametrize("dtype", ACTIVATION_DTYPES)
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.float16, *FP8])
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim", [(9, 3, 64), (4, 4, 32), (8, 1, 128)])
@pytest.mark.parametrize("rotary_fraction", [1, 0.25, 0])  # whole heads, Pythia's, GPT-2's none
def test_rotary_embedding_and_cache_equals_rope_then_write(
    march, dtype, kv_dtype, num_heads, num_kv_heads, head_dim, rotary_fraction
):
    torch.manual_seed(head_dim + num_heads)
    num_tokens, num_slots = 37, 64 * 16
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_tokens, width + 5).to(dtype)[:, :width]  # rows width + 5 apart
    rotary_dim = int(head_dim * rotary_fraction)
    angles = torch.rand(num_tokens, 1, rotary_dim // 2) * 100
    rope = Rope(angles.cos(), angles.sin()) if rotary_dim else None
    slots = torch.randperm(num_slots)[:num_tokens]
    shape = (64, 16, num_kv_heads, head_dim)
    caches = [torch.full(shape, float("nan"), dtype=kv_dtype) for _ in range(4)]

    q, k, v = qkv.split([num_heads * head_dim, *[num_kv_heads * head_dim] * 2], dim=-1)
    q_ref = q.reshape(num_tokens, num_heads, head_dim)
    k_ref = k.reshape(num_tokens, num_kv_heads, head_dim)
    if rope is not None:
        q_ref, k_ref = rope.apply(q_ref), rope.apply(k_ref)
    q_ref = q_ref.clone()  # qkv rotates in place below
    v_ref = v.reshape(num_tokens, num_kv_heads, head_dim)
    write_kv(k_ref, v_ref, caches[0], caches[1], slots)

    cos = sin = None
    if rope is not None:
        cos, sin = rope.cos.view(num_tokens, -1), rope.sin.view(num_tokens, -1)
    cpu_ops.rotary_embedding_and_cache(
        qkv, cos, sin, num_heads, num_kv_heads, caches[2], caches[3], slots
    )
    assert torch.equal(qkv[:, : num_heads * head_dim].view_as(q_ref), q_ref)
    for ours, ref in zip(caches[2:], caches[:2]):  # the untouched slots are still NaN in both
        assert torch.equal(ours.float().nan_to_num(7.0), ref.float().nan_to_num(7.0))


def written_values(values: torch.Tensor, kv_dtype: torch.dtype) -> torch.Tensor:
    """values (float32 or bfloat16, a multiple of 64 of them) written as V rows by
    rotary_embedding_and_cache into a kv_dtype cache, one 64-wide row a token."""
    rows = values.view(-1, 64)
    num_tokens = rows.shape[0]
    qkv = torch.zeros(num_tokens, 3 * 64, dtype=values.dtype)
    qkv[:, 128:] = rows
    key_cache, value_cache = (torch.zeros(num_tokens, 1, 1, 64, dtype=kv_dtype) for _ in "kv")
    cos, sin = torch.ones(num_tokens, 32), torch.zeros(num_tokens, 32)
    slots = torch.arange(num_tokens)
    cpu_ops.rotary_embedding_and_cache(qkv, cos, sin, 1, 1, key_cache, value_cache, slots)
    return value_cache.view(-1)


@pytest.mark.parametrize("kv_dtype", FP8)
def test_fp8_writes_round_as_torch_rounds_the_saturated_value(march, kv_dtype):
    """Every finite bfloat16 value, and float32 ones around every rounding boundary, subnormals
    and the largest finite value, narrow to the bits torch gives the value clamped to the fp8
    type's range (as vLLM's kernels saturate); zeros may differ in sign."""
    finite = torch.finfo(kv_dtype).max
    every_bf16 = (
        torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    )
    every_bf16 = every_bf16[every_bf16.isfinite()][: (2**16 - 512) // 64 * 64]
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(kv_dtype).float()
    codes = codes[codes.isfinite()]
    near = torch.cat([codes, codes.nextafter(codes + 1), codes.nextafter(codes - 1)])
    ties = (codes[:-1] + codes[1:]) / 2  # halfway between neighbours (sorted within each sign)
    tiny = torch.finfo(kv_dtype).smallest_normal
    specials = torch.tensor([finite, -finite, finite * 1.01, 1e30, -1e30, tiny, tiny / 3, 1e-30])
    float32 = torch.cat([near, ties, ties.nextafter(ties + 1), specials, torch.randn(4096) * 100])
    float32 = torch.cat([float32, torch.zeros(-len(float32) % 64)])
    for values in (every_bf16, float32):
        got = written_values(values, kv_dtype).float()
        want = values.float().clamp(-finite, finite).to(kv_dtype).float()
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", ACTIVATION_DTYPES)
@pytest.mark.parametrize("n", [1, 7, 33, 49152, 49157])  # tails past whole vectors
def test_argmax_is_torchs(march, dtype, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(300, n, generator=g).to(dtype)
    x[1] = 0.0  # all equal: the first
    x[2] = float("-inf")
    x[3, n // 2 :] = 1e9  # a run of equal maxima: the first of them
    x[4, -1] = 1e9  # the maximum in the tail
    x[5, n // 3] = float("nan")  # NaN wins, as in torch
    x[6, n - 1] = float("nan")
    x[6, n // 2] = float("nan")
    ties = torch.randint(0, 3, (20, n), generator=g).to(dtype)
    strided = torch.randn(9, 2 * n, generator=g).to(dtype)[:, :n]  # rows further apart
    for t in (x, ties, strided):
        assert torch.equal(cpu_ops.argmax(t), t.argmax(dim=-1))


def test_arguments_are_checked():
    with pytest.raises(TypeError, match="of one dtype"):
        cpu_ops.rms_norm(torch.randn(2, 8, dtype=torch.bfloat16), torch.ones(8), 1e-5)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        cpu_ops.silu_and_mul(torch.randn(2, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="even width"):
        cpu_ops.silu_and_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match="rows must be contiguous"):
        cpu_ops.argmax(torch.randn(7, 2).t())
    with pytest.raises(ValueError, match="one slot per token"):
        cache = torch.zeros(4, 4, 1, 8)
        rope = torch.zeros(2, 4)
        cpu_ops.rotary_embedding_and_cache(
            torch.randn(2, 24), rope, rope, 1, 1, cache, cache.clone(), torch.zeros(2).int()
        )
