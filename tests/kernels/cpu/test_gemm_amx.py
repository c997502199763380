"""Which bfloat16 layers the AMX matmul (kernels/cpu_gemm_amx.c) takes (K a multiple of 32, the
dot-product kernel the others), and that its tiles never read past x's last row. Its other cases
(accuracy, tails of 16-row tiles, rows independent of the batch) are the dot-product kernel's,
which run on both kernels here (tests/kernels/cpu/test_gemm_bf16.py); then its float32 path
(x in three bfloat16 parts). Skipped without AMX."""

import ctypes
import mmap

import pytest
import torch

from pagedgen.kernels import cpu_gemm_bf16, cpu_gemm_quant_bf16
from pagedgen.kernels.cpu_build import record_calls
from pagedgen.kernels.cpu_features import has_amx_bf16, kernel_march
from pagedgen.layers.linear import PAIR_PANELS_F32, PANELS, Linear
from tests.kernels.cpu.test_gemm_bf16 import assert_rounded_once

# Where the CPU has AMX, a kernel that fails to build fails these tests: it does not skip them.
pytestmark = pytest.mark.skipif(
    not has_amx_bf16() or kernel_march() != "native", reason="no AMX bfloat16 tiles here"
)


def kernels_called(x, packed, bias, n) -> tuple[torch.Tensor, list[str]]:
    names: list[str] = []
    with record_calls(lambda fn, args, status: names.append(fn.__name__)):
        out = cpu_gemm_bf16.linear(x, packed, bias, n)
    return out, names


def test_it_builds_and_takes_the_bfloat16_layers():
    assert cpu_gemm_bf16.amx_error() is None
    assert cpu_gemm_bf16.enabled()


def test_the_quantized_weights_tiles_build_beside_it():
    """cpu_gemm_quant_bf16.c shares this kernel's passes (amx_gemm.h); its tests skip where it
    does not build, so the build is checked here, where the CPU has the tiles."""
    assert cpu_gemm_quant_bf16.error() is None


@pytest.mark.parametrize(
    "k, kernel",
    [(576, "linear_bf16_amx"), (64, "linear_bf16_amx")]
    + [(48, "linear_bf16"), (37, "linear_bf16"), (2500, "linear_bf16")],
)
def test_layers_whose_k_is_a_multiple_of_32_take_it(k, kernel):
    torch.manual_seed(k)
    weight, x = torch.randn(40, k).bfloat16(), torch.randn(20, k).bfloat16()
    out, names = kernels_called(x, cpu_gemm_bf16.pack(weight), None, 40)
    assert names == [kernel]
    assert_rounded_once(out, x, weight, None)


@pytest.mark.parametrize("rows", [1, 15, 17, 31, 33, 54])
def test_no_tile_reads_past_the_last_row_of_x(rows):
    """x ends where a page that cannot be read begins: a tile configured with more rows than x
    has left would fault."""
    k, page = 64, mmap.PAGESIZE
    nbytes = rows * k * 2
    readable = -(-nbytes // page) * page
    region = mmap.mmap(-1, readable + page)
    start = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    guard = ctypes.c_void_p(start + readable)
    assert libc.mprotect(guard, page, 0) == 0  # PROT_NONE
    try:
        x = torch.frombuffer(region, dtype=torch.bfloat16, count=rows * k, offset=readable - nbytes)
        x.copy_(torch.randn(rows, k).bfloat16().flatten())
        weight = torch.randn(48, k).bfloat16()
        out, names = kernels_called(x.view(rows, k), cpu_gemm_bf16.pack(weight), None, 48)
        assert names == ["linear_bf16_amx"]
        assert_rounded_once(out, x.view(rows, k), weight, None)
    finally:
        libc.mprotect(guard, page, mmap.PROT_READ | mmap.PROT_WRITE)


def rows_alone(k: int, n: int, rows: int, checked: set[int]) -> tuple[torch.Tensor, ...]:
    """x [rows, k] @ W [n, k] in one call on the AMX kernel: the checked rows as each came alone,
    all rounded once. Returns the output, x and the packed weight."""
    torch.manual_seed(rows)
    weight, x = torch.randn(n, k).bfloat16(), torch.randn(rows, k).bfloat16()
    packed = cpu_gemm_bf16.pack(weight)
    out, names = kernels_called(x, packed, None, n)
    assert names == ["linear_bf16_amx"]
    for r in sorted(checked & set(range(rows))):
        assert torch.equal(out[r : r + 1], cpu_gemm_bf16.linear(x[r : r + 1], packed, None, n))
    assert_rounded_once(out, x, weight, None)
    return out, x, packed


@pytest.mark.parametrize("rows", [61, 96, 100, 128])
def test_a_decode_batch_at_large_k_in_one_block_matches_its_rows_alone(rows):
    """At K = 8,192 a block of x holds 64 rows; up to 128 take one block, its groups of 32 rows
    (the last one partial) taking each pair a slice of k at a time, their sums stored and
    reloaded. Each row as when it came alone or with the first 64, and rounded once."""
    out, x, packed = rows_alone(8192, 80, rows, {0, 32, 63, 64, rows - 1})
    assert torch.equal(out[:64], cpu_gemm_bf16.linear(x[:64], packed, None, 80))


@pytest.mark.parametrize("k", [2048, 4096])
def test_prompt_rows_taking_the_weight_in_chunks_match_their_rows_alone(k):
    """x of several blocks (300 rows: 128, 128, then 44) takes a thread's pairs a chunk (2 MB) at
    a time, every block in turn and, at K = 4,096, each block the chunk's pairs a slice of k at a
    time, each pair's sums kept between slices (2,600 columns, the last panel partial: 82 pairs,
    several chunks a thread). Each row as when it came alone, and rounded once."""
    rows_alone(k, 2600, 300, {0, 31, 127, 128, 255, 256, 299})


@pytest.mark.parametrize("rows", [61, 300])
def test_rows_at_k_past_8192_match_their_rows_alone(rows):
    """Past K = 8,192 a group of 32 rows would fill a decode batch's block of x: up to 256 rows
    are one block whose groups take each pair a slice of k at a time (61 rows); a prompt (300
    rows) takes blocks of 128, each a slice at a time. Each row as when it came alone, and
    rounded once."""
    rows_alone(9216, 48, rows, {0, 31, 32, 127, 128, 255, 256, rows - 1})


def float32_error(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias) -> float:
    """y's largest error against float64, relative to the sum of the terms' magnitudes."""
    x64, w64 = x.double(), weight.double()
    b64 = torch.zeros(weight.shape[0], dtype=torch.float64) if bias is None else bias.double()
    scale = x64.abs() @ w64.abs().T + b64.abs()
    return ((y.double() - (x64 @ w64.T + b64)).abs() / scale).max().item()


@pytest.mark.parametrize(
    "m, n, k, bias",
    [(1, 40, 64, False), (15, 100, 576, True), (17, 33, 96, True), (61, 300, 2048, False)]
    + [(100, 70, 8192, True), (300, 48, 2048, False)],
)
def test_float32_activations_over_bfloat16_panels_are_float32_accurate(m, n, k, bias):
    """x split into three bfloat16 parts, their products summed in float32: as close to the
    exact result as a float32 matmul (oneDNN's) is, with x over 6 decades."""
    torch.manual_seed(m * n + k)
    weight = torch.randn(n, k).bfloat16().float()
    x = torch.randn(m, k) * torch.logspace(-3, 3, k)[torch.randperm(k)]
    b = torch.randn(n) if bias else None
    assert cpu_gemm_bf16.takes_float32(weight)
    out = cpu_gemm_bf16.linear_float32(x, cpu_gemm_bf16.pack(weight.bfloat16()), b, n)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    reference = float32_error(torch.nn.functional.linear(x, weight, b), x, weight, b)
    assert float32_error(out, x, weight, b) <= 2 * reference + 1e-7


@pytest.mark.parametrize("k", [2048, 2560, 8192])
def test_float32_rows_do_not_depend_on_the_batch(k):
    """At K = 8,192 x's parts take blocks of 32 rows; at K = 2,560 all 77 rows are one block,
    whose three groups take each pair a slice of k at a time: every row as when it came alone."""
    torch.manual_seed(k)
    weight, x = torch.randn(50, k).bfloat16(), torch.randn(77, k)
    packed = cpu_gemm_bf16.pack(weight)
    out = cpu_gemm_bf16.linear_float32(x, packed, None, 50)
    for r in (0, 31, 32, 63, 64, 76):
        alone = cpu_gemm_bf16.linear_float32(x[r : r + 1], packed, None, 50)
        assert torch.equal(out[r : r + 1], alone)


def test_only_weights_of_bfloat16_values_take_the_float32_path():
    weight = torch.randn(32, 64).bfloat16().float()
    assert cpu_gemm_bf16.takes_float32(weight)
    assert not cpu_gemm_bf16.takes_float32(weight[:, :48].contiguous())  # K not a multiple of 32
    weight[3, 5] += 2**-20
    assert not cpu_gemm_bf16.takes_float32(weight)


def test_a_float32_layer_of_bfloat16_values_packs_for_the_float32_path():
    layer, other = Linear(64, [32, 16], bias=True), Linear(64, 48)
    layer.weight.data.copy_(torch.randn(48, 64).bfloat16().float())
    layer.bias.data.normal_()
    other.weight.data.normal_()
    x = torch.randn(5, 64)
    expected = torch.nn.functional.linear(x, layer.weight.data.clone(), layer.bias.data.clone())
    assert layer.pack(torch.float32) and layer.layout == PAIR_PANELS_F32
    assert layer.weight.dtype == torch.int16  # half the bytes of float32 panels
    assert other.pack(torch.float32) and other.layout == PANELS
    assert torch.allclose(layer(x), expected, rtol=1e-5, atol=1e-5)
