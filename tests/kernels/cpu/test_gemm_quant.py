"""The quantized matmul (kernels/cpu_gemm_quant.c) against two references: its own scheme in torch
(x quantized to 15-bit integers, or with one digit 8-bit ones, in blocks of the weight's granule,
exact integer sums per block, the float epilogue in the kernel's order), which every build must
match bit for bit (AVX-512 VNNI where the machine has it, AVX2 as x86-64-v3, with AVX-VNNI where
it has that, plain C as x86-64); and the dequantized weight in float32, which it must match within
the error of quantizing x. On a CPU with AMX-INT8 its tile build runs the same two-digit cases
(from one row: it runs from AMX_MIN_ROWS in use)."""

import pytest
import torch

from pagedgen.kernels import cpu_gemm_quant
from pagedgen.kernels.cpu_features import cpu_flags
from pagedgen.layers.quantized_weight import QuantizedWeight, pack_int4
from tests.kernels.cpu.test_paged_attention import MARCHES

# AVX2 with AVX-VNNI's 256-bit vpdpbusd (what an AVX2 machine that has it builds natively), where
# this CPU can run it.
MARCHES = MARCHES + ["x86-64-v3+avxvnni"] * ({"avx2", "avx_vnni"} <= cpu_flags())
BUILDS = MARCHES + ["amx"] * (cpu_gemm_quant.amx_error() is None)

# (bits, group_size, mins): online int4 and int8; Q4_0 / Q4_K (groups of 32, mins); Q6_K and
# Q8_0 (signed, groups of 16 and 32); a group of 48 (a multiple of 16, not 32); GPTQ's 8 bits
# (a minimum a group).
FORMATS = [(4, 128, True), (8, None, False), (4, 32, True), (8, 16, False), (8, 32, False)]
FORMATS += [(4, 16, False), (4, 48, True), (4, 64, True), (8, 64, True)]
ROWS = [1, 3, 17, 64, 65]
DIGITS = [2, 1]  # x's int8 digits: about 15 bits, or 8 (W8A8)


def random_weight(n: int, k: int, bits: int, group_size: int | None, mins: bool, seed: int):
    torch.manual_seed(seed)
    group_size = group_size or k
    groups = k // group_size
    if bits == 8:
        qweight = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    else:
        qweight = pack_int4(torch.randint(0, 16, (n, k)))
    scales = torch.rand(n, groups) * 0.02
    return QuantizedWeight(
        bits, group_size, qweight, scales, -torch.rand(n, groups) * 0.1 if mins else None
    )


def pack(qw: QuantizedWeight, march: str | None = None, half: bool = False) -> torch.Tensor:
    args = (qw.qweight, qw.scales, qw.mins, qw.bits, qw.group_size)
    return cpu_gemm_quant.pack(*args, half=half, march=march)


def float16_valued(qw: QuantizedWeight) -> QuantizedWeight:
    """qw with its scales and mins rounded to float16 values, some of them subnormal."""
    scales = qw.scales.half()
    scales[0] = torch.arange(1, scales.shape[1] + 1) * 2**-24  # subnormal float16
    mins = None if qw.mins is None else qw.mins.half().float()
    return QuantizedWeight(qw.bits, qw.group_size, qw.qweight, scales.float(), mins)


@pytest.fixture(autouse=True)
def amx_from_one_row(monkeypatch):
    monkeypatch.setattr(cpu_gemm_quant, "AMX_MIN_ROWS", {4: 1, 8: 1})


def run(x, qw, packed, bias=None, march=None, out=None, half=False, digits=2):
    """The machine's kernel (AMX where it has the tiles), or march's build ("amx": the tiles,
    which take two digits)."""
    n = qw.shape[0]
    args = (n, qw.bits, qw.group_size, qw.mins is not None, half)
    march = None if march == "amx" else march or "native"
    return cpu_gemm_quant.linear(x, packed, bias, *args, out=out, march=march, digits=digits)


def builds(digits: int) -> list[str]:
    return BUILDS if digits == 2 else MARCHES


def granule(group_size: int) -> int:
    """The kernel's block of k: the largest of 128, 64, 32, 16 that divides the group."""
    return next(size for size in (128, 64, 32, 16) if group_size % size == 0)


def quantize_rows(
    x: torch.Tensor, block: int, digits: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """x as integers in blocks: (v [M, K], |v| <= 32512, steps e [M, K / block]), x ~ e * v. The
    kernel holds v as two int8 digits, 255 * hi + lo; its sums of w * v are exact either way. With
    one digit, |v| <= 127."""
    m, k = x.shape
    levels = 32512 if digits == 2 else 127
    blocks = x.float().view(m, -1, block)
    e = blocks.abs().amax(dim=-1) / levels
    inverse = torch.where(e > 0, 1 / e, torch.zeros_like(e))
    return (blocks * inverse[..., None]).round().clamp(-levels, levels).view(m, k), e


def test_activation_digits_cover_every_integer_once():
    v = torch.arange(-32512, 32513)
    hi = torch.div(v + 127, 255, rounding_mode="floor")
    lo = v - 255 * hi
    assert hi.abs().max() == 127 and lo.abs().max() == 127


def scheme_reference(
    x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None, digits: int = 2
):
    """The kernel's arithmetic in torch, op for op."""
    m, k = x.shape
    xf = x.float()
    size = granule(qw.group_size)
    xq, e = quantize_rows(x, size, digits)
    w = qw.values().double()
    xg = xq.double().view(m, -1, size).transpose(0, 1)
    isums = (xg @ w.view(qw.shape[0], -1, size).permute(1, 2, 0)).float()  # exact
    acc = torch.zeros(m, qw.shape[0])
    per_group = qw.group_size // size
    for i in range(k // size):
        g = i // per_group
        acc = acc + isums[i] * (e[:, i, None] * qw.scales[None, :, g])
        if qw.mins is not None and (i + 1) % per_group == 0:
            xsum = xf[:, g * qw.group_size : (g + 1) * qw.group_size].double().cumsum(-1)[:, -1]
            acc = acc + qw.mins[None, :, g] * xsum.float()[:, None]
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(x.dtype)


def assert_close_to_dequantized(y, x, qw, bias, digits=2):
    """Each block of x is off by at most half a step (max|x| / 65024, or / 254 with one digit) an
    element: the error of a row's output is below sum over k of |W[n, k]| * step(k) / 2, plus
    y's own rounding (two digits' bound fails one digit's outputs)."""
    xf = x.float()
    ref = xf @ qw.dequantize().T + (0 if bias is None else bias.float())
    size = granule(qw.group_size)
    _, e = quantize_rows(x, size, digits)
    half_step = (e / 2).repeat_interleave(size, dim=1)
    bound = half_step @ qw.dequantize().abs().T * 1.001 + ref.abs() * 2**-20 + 1e-6
    if y.dtype == torch.bfloat16:
        bound = bound + ref.abs() * 2**-8
    assert ((y.float() - ref).abs() <= bound).all(), ((y.float() - ref).abs() / bound).max()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("half", [False, True], ids=["float32 params", "float16 params"])
@pytest.mark.parametrize("digits", DIGITS)
def test_every_build_matches_the_scheme_bit_for_bit(fmt, dtype, half, digits):
    bits, group_size, mins = fmt
    n = 37  # past whole panels
    k = 336 if group_size == 48 else 384  # 336: 48 * 7, not a multiple of 32
    qw = random_weight(n, k, bits, group_size, mins, seed=bits + k)
    if half:
        qw = float16_valued(qw)
        assert cpu_gemm_quant.float16_params(qw.scales, qw.mins)
    bias = torch.randn(n).to(dtype)
    packs = {march: pack(qw, march, half) for march in MARCHES}
    assert all(torch.equal(p, packs["native"]) for p in packs.values())  # one layout
    for rows in ROWS:
        x = (torch.randn(rows, k) * torch.rand(rows, 1) * 4).to(dtype)
        x[0, :5] = 0  # a block's zeros quantize to zero
        ref = scheme_reference(x, qw, bias, digits)
        for march in builds(digits):
            y = run(x, qw, packs["native"], bias, march, half=half, digits=digits)
            assert y.dtype == dtype and torch.equal(y, ref), (march, rows)
        assert_close_to_dequantized(y, x, qw, bias, digits)


def test_one_digit_is_coarser_than_two():
    qw = random_weight(40, 256, 8, None, False, seed=9)
    x = torch.randn(4, 256)
    exact = x @ qw.dequantize().T
    one, two = (run(x, qw, pack(qw), digits=d) for d in (1, 2))
    assert (one - exact).abs().max() > 100 * (two - exact).abs().max()


@pytest.mark.parametrize("fmt", [(4, 32, True), (8, 32, False), (8, None, False)])
def test_float16_params_take_fewer_bytes_for_the_same_outputs(fmt):
    qw = float16_valued(random_weight(40, 256, *fmt, seed=6))
    wide, narrow = pack(qw), pack(qw, half=True)
    ints, params = 16 * 256 * fmt[0] // 8, 16 * (256 // (fmt[1] or 256)) * (1 + fmt[2])
    assert wide.numel() == 3 * (ints + 4 * params)  # 3 panels of 16 columns
    assert narrow.numel() == 3 * (-(-(ints + 2 * params) // 64) * 64)  # each a multiple of 64
    x = torch.randn(5, 256)
    for march in BUILDS:
        y = run(x, qw, narrow, march=march, half=True)
        assert torch.equal(y, run(x, qw, wide, march=march))


def test_only_float16_values_pack_as_float16():
    qw = random_weight(16, 64, 4, 32, True, seed=7)
    assert not cpu_gemm_quant.float16_params(qw.scales, qw.mins)
    assert not cpu_gemm_quant.float16_params(torch.full((2, 2), 1e5), None)  # past float16's range
    assert cpu_gemm_quant.float16_params(qw.scales.half().float(), None)
    with pytest.raises(ValueError, match="not float16 values"):
        pack(qw, half=True)


@pytest.mark.parametrize("k", [64 * 3 + 32, 48])  # a multiple of 32 not of 64; of 16 only
@pytest.mark.parametrize("digits", DIGITS)
def test_k_tails(k, digits):
    group_size = 16 if k == 48 else 32
    for bits in (4, 8):
        qw = random_weight(19, k, bits, group_size, bits == 4, seed=k)
        packed = pack(qw)
        x = torch.randn(5, k)
        ref = scheme_reference(x, qw, None, digits)
        for march in builds(digits):
            assert torch.equal(run(x, qw, packed, march=march, digits=digits), ref), march


@pytest.mark.parametrize("digits", DIGITS)
def test_integer_sums_at_their_extremes(digits):
    """Every |v| at its bound against weights of 127 and of -128 (VNNI sums the latter as 0 and
    the former as 255 before taking 128 * sum(v) out): 128 k a block, no int32 overflow."""
    n, k = 32, 256
    qweight = torch.full((n, k), 127, dtype=torch.int8)
    qweight[n // 2 :] = -128
    qw = QuantizedWeight(8, 128, qweight, torch.full((n, 2), 0.01), None)
    x = torch.ones(4, k)
    x[1] = -1
    x[2, ::2] = -1
    x[3, k // 2 :] = -1
    packed = pack(qw)
    ref = scheme_reference(x, qw, None, digits)
    assert ref[0, 0] > 0.99 * 127 * k * 0.01 and ref[1, -1] > 0.99 * 128 * k * 0.01  # the largest
    for march in builds(digits):
        assert torch.equal(run(x, qw, packed, march=march, digits=digits), ref), march


def test_an_all_zero_row_and_a_zero_weight():
    qw = random_weight(16, 64, 4, 32, True, seed=1)
    qw = QuantizedWeight(4, 32, qw.qweight, torch.zeros_like(qw.scales), qw.mins)
    x = torch.randn(3, 64)
    x[1] = 0
    for march in BUILDS:
        assert torch.equal(run(x, qw, pack(qw), march=march), scheme_reference(x, qw, None))


@pytest.mark.parametrize("digits", DIGITS)
def test_a_nan_in_x_counts_as_zero_and_every_build_agrees_on_infinities(digits):
    qw = random_weight(32, 256, 8, 32, False, seed=8)  # no mins: x's sums play no part
    x = torch.randn(3, 256)
    zeroed = x.clone()
    x[0, 40], zeroed[0, 40] = float("nan"), 0.0
    x[1, 200], x[2, 7] = float("inf"), -float("inf")
    packed = pack(qw)
    outputs = [run(x, qw, packed, march=march, digits=digits) for march in builds(digits)]
    assert torch.equal(outputs[0][0], run(zeroed, qw, packed, digits=digits)[0])
    for y in outputs:
        torch.testing.assert_close(y, outputs[0], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("fmt", [(4, 128, True), (8, None, False)])
@pytest.mark.parametrize("march,digits", [(m, 2) for m in BUILDS] + [(m, 1) for m in MARCHES])
def test_rows_do_not_depend_on_the_batch_and_strided_rows_are_read(fmt, march, digits, monkeypatch):
    monkeypatch.setattr(cpu_gemm_quant, "AMX_MIN_ROWS", {4: 6, 8: 2})  # as in use: by rows
    qw = random_weight(70, 256, *fmt, seed=3)
    packed = pack(qw)
    wide = torch.randn(70, 300)
    x = wide[:, 20:276]  # rows 300 apart
    full = run(x, qw, packed, march=march, digits=digits)
    for rows in (1, 3, 8, 9, 15, 16, 17, 33, 64):
        assert torch.equal(run(x[:rows], qw, packed, march=march, digits=digits), full[:rows])
        assert torch.equal(run(x[-rows:], qw, packed, march=march, digits=digits), full[-rows:])
    assert torch.equal(run(x.contiguous(), qw, packed, march=march, digits=digits), full)
    three_d = run(x.reshape(7, 10, 256), qw, packed, march=march, digits=digits)
    assert three_d.shape == (7, 10, 70) and torch.equal(three_d.reshape(70, 70), full)


def test_writes_into_a_column_range_of_a_wider_output():
    qw = random_weight(20, 64, 8, 16, False, seed=4)
    x = torch.randn(6, 64).bfloat16()
    out = torch.full((6, 50), 7.0).bfloat16()
    run(x, qw, pack(qw), out=out[:, 10:30])
    assert torch.equal(out[:, 10:30], run(x, qw, pack(qw)))
    assert (out[:, :10] == 7).all() and (out[:, 30:] == 7).all()


def test_rejects_what_it_cannot_compute():
    with pytest.raises(ValueError, match="groups of 24"):
        cpu_gemm_quant.pack(torch.zeros(4, 48, dtype=torch.int8), torch.ones(4, 2), None, 8, 24)
    qw = random_weight(16, 64, 4, 32, True, seed=5)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        run(torch.zeros(1, 64, dtype=torch.float16), qw, pack(qw))
    with pytest.raises(ValueError, match="is not 16 x 96"):
        run(torch.zeros(1, 96), qw, pack(qw))
