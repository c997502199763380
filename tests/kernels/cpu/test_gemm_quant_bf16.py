"""The 4- and 8-bit matmul with the bfloat16 path's bits (kernels/cpu_gemm_quant_bf16.c) against
the dense bfloat16 path (cpu_gemm_bf16) over the same weight dequantized in float32 and rounded to
bfloat16: equal to the bit, for every batch size, group, tail and stride. On AMX: the tile steps up
to DENSE_MIN_ROWS rows, the dense kernel's passes on the weight dequantized a chunk at a time from
there; on AVX512_BF16 (also PAGEDGEN_MAX_CPU_ISA=avx512 on an AMX machine): the dense dot-product
kernel over pairs of panels dequantized a pair or a chunk at a time."""

import pytest
import torch

from pagedgen.kernels import cpu_gemm_bf16, cpu_gemm_quant_bf16
from pagedgen.layers.quantized_weight import QuantizedWeight, pack_int4

pytestmark = pytest.mark.skipif(
    cpu_gemm_quant_bf16.error() is not None,
    reason=f"no kernel with the bfloat16 path's bits: {cpu_gemm_quant_bf16.error()}",
)

ROWS = [1, 3, 16, 17, 64, 65, 130]


def random_weight(
    n: int,
    k: int,
    group: int,
    mins: bool,
    seed: int,
    spread: int = 0,
    half: bool = True,
    bits: int = 4,
):
    """Scales over 2^-spread .. 2^spread of their base; with half, scales and mins are float16
    values, as GGUF's are (then a 4-bit q * scale is exact), else any float32."""
    torch.manual_seed(seed)
    groups = k // group
    scales = torch.rand(n, groups) * 0.02 * 2.0 ** torch.randint(-spread, spread + 1, (n, groups))
    mins = -torch.rand(n, groups) * 0.1 if mins else None
    if half:
        scales, mins = scales.half().float(), None if mins is None else mins.half().float()
    if bits == 8:
        qweight = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    else:
        qweight = pack_int4(torch.randint(0, 16, (n, k)))
    return QuantizedWeight(bits, group, qweight, scales, mins)


def dense_reference(x, qw, bias):
    """The dense kernel over the dequantized weight, 64 rows a call (a decode batch's one pass:
    not the prompt passes the quantized prompt path shares)."""
    dense = cpu_gemm_bf16.pack(qw.dequantize().bfloat16())
    rows = [
        cpu_gemm_bf16.linear(x[r : r + 64], dense, bias, qw.shape[0]) for r in range(0, len(x), 64)
    ]
    return torch.cat(rows)


def run(x, qw, bias=None, out=None):
    packed = cpu_gemm_quant_bf16.pack(qw.qweight, qw.scales, qw.mins, qw.bits, qw.group_size)
    args = (qw.shape[0], qw.bits, qw.group_size, qw.mins is not None)
    return cpu_gemm_quant_bf16.linear(x, packed, bias, *args, out=out)


@pytest.fixture(params=["tile steps", "dense from 100 rows"])
def dense_min_rows(request, monkeypatch):
    if request.param != "tile steps":
        monkeypatch.setattr(cpu_gemm_quant_bf16, "DENSE_MIN_ROWS", 100)


@pytest.mark.parametrize("group,k", [(32, 576), (64, 192), (128, 256)])
@pytest.mark.parametrize("mins", [True, False], ids=["mins", "no mins"])
@pytest.mark.parametrize("half", [True, False], ids=["float16 params", "float32 params"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.usefixtures("dense_min_rows")
def test_the_dense_bfloat16_bits_at_every_batch(group, k, mins, half, bits):
    n = 37  # past whole panels
    qw = random_weight(n, k, group, mins, seed=group + k, spread=8, half=half, bits=bits)
    bias = torch.randn(n).bfloat16()
    for rows in ROWS:
        x = (torch.randn(rows, k) * 2.0 ** torch.randint(-6, 7, (rows, 1))).bfloat16()
        assert torch.equal(run(x, qw, bias), dense_reference(x, qw, bias)), rows


@pytest.mark.usefixtures("dense_min_rows")
@pytest.mark.parametrize("bits", [4, 8])
def test_rows_do_not_depend_on_the_batch_and_strided_rows_are_read(bits):
    qw = random_weight(48, 128, 32, True, seed=3, bits=bits)
    wide = torch.randn(130, 160).bfloat16()
    x = wide[:, 16:144]  # rows 160 apart
    full = run(x, qw)
    for rows in (1, 15, 16, 17, 64, 65, 129):
        assert torch.equal(run(x[:rows], qw), full[:rows])
        assert torch.equal(run(x[-rows:], qw), full[-rows:])
    assert torch.equal(run(x.contiguous(), qw), full)
    assert torch.equal(full, dense_reference(x, qw, None))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k", [2048, 4096])
def test_prompt_rows_over_several_chunks_and_blocks_keep_the_dense_bits(bits, k):
    """A prompt's rows (600: blocks of 128, the last of 88) take each thread's pairs a chunk (2 MB
    dequantized: 17 pairs at K = 2,048, 9 at 4,096) at a time, every block in turn, a slice of k
    at a time where K takes two (2,600 columns, the last panel partial: 82 pairs, several chunks a
    thread)."""
    qw = random_weight(2600, k, 128, True, seed=6, bits=bits)
    x = torch.randn(600, k).bfloat16()
    bias = torch.randn(2600).bfloat16()
    assert torch.equal(run(x, qw, bias), dense_reference(x, qw, bias))


@pytest.mark.usefixtures("dense_min_rows")
def test_out_takes_a_column_range_of_a_wider_output():
    qw = random_weight(20, 64, 32, False, seed=4)
    x = torch.randn(120, 64).bfloat16()
    y = torch.full((120, 50), 7.0, dtype=torch.bfloat16)
    run(x, qw, out=y[:, 10:30])
    assert torch.equal(y[:, 10:30], dense_reference(x, qw, None))
    assert (y[:, :10] == 7).all() and (y[:, 30:] == 7).all()


def test_only_groups_of_a_multiple_of_32_are_taken():
    assert cpu_gemm_quant_bf16.takes(4, 32, 64) and cpu_gemm_quant_bf16.takes(4, 128, 256)
    assert cpu_gemm_quant_bf16.takes(8, 64, 64)  # int8 per row
    assert not cpu_gemm_quant_bf16.takes(4, 16, 64)  # a k step is 32
    assert not cpu_gemm_quant_bf16.takes(8, 16, 64)  # Q6_K's groups
    qw = random_weight(16, 96, 32, True, seed=5)
    scales = qw.scales.repeat_interleave(3, 1)[:, :2]
    with pytest.raises(ValueError, match="groups of 48"):
        cpu_gemm_quant_bf16.pack(qw.qweight, scales, None, 4, 48)
