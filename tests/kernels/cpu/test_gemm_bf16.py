"""The bfloat16 panel matmuls against float64: the dot-product kernel (kernels/cpu_gemm_bf16.c) for
every build a machine of ours may run (where the build lacks AVX512_BF16 it must say so), and on
a CPU with AMX the AMX kernel (kernels/cpu_gemm_amx.c) on the same cases, where K lets it."""

import pytest
import torch
import torch.nn.functional as F

from pagedgen.kernels import cpu_gemm_bf16
from tests.kernels.cpu.test_paged_attention import MARCHES

needs_kernel = pytest.mark.skipif(
    cpu_gemm_bf16.cpu_gemm_bf16_error() is not None,
    reason=f"no AVX512_BF16 matmul here: {cpu_gemm_bf16.cpu_gemm_bf16_error()}",
)
KERNELS = ["dot_product"] + ["amx"] * (cpu_gemm_bf16.amx_error() is None)


@pytest.fixture(autouse=True, params=KERNELS)
def kernel(request, monkeypatch) -> str:
    if request.param == "dot_product":
        monkeypatch.setattr(cpu_gemm_bf16, "amx_error", lambda: "the dot-product kernel's tests")
    return request.param


# (N, K): SmolLM2's projections and head; N not a multiple of 16 or 32; odd K; one tile of k.
SHAPES = [(960, 576), (576, 1536), (49152, 576), (1000, 37), (7, 2501), (33, 3000), (7, 2048)]
SHAPES += [(48, 32)]
# 103 panels: 26 quads at up to two threads, the last of three panels, its last partial
SHAPES += [(1643, 96)]
ROWS = [1, 5, 12, 13, 59, 100]  # below, at and past one 12-row tile
ROWS += [15, 16, 17, 31, 32, 33]  # ... and the AMX kernel's 16-row tiles, two at a time
# Past the rows read in one pass over W: 696 (4 MiB of x) at K = 3000; the AMX kernel's 256
# (1 MiB) at K = 2048.
PASS_ROWS = {3000: 800, 2048: 300}


def exact(x, weight, bias):
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double())


def assert_rounded_once(out, x, weight, bias):
    """Products summed in float32, then one rounding to bfloat16: within an ulp of bfloat16
    (2^-8 relative) of the exact result, plus the float32 sum's own error."""
    assert out.dtype == torch.bfloat16
    ref = exact(x, weight, bias)
    scale = exact(x.abs(), weight.abs(), None if bias is None else bias.abs())
    err = (out.double() - ref).abs()
    assert (err <= ref.abs() * 2**-8 + scale * 1e-6 + 1e-30).all(), err.max()


@pytest.mark.slow
@needs_kernel
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float64_rounded_once(shape, bias):
    n, k = shape
    torch.manual_seed(n + k)
    weight = (torch.randn(n, k) * 0.05).bfloat16()
    b = torch.randn(n).bfloat16() if bias else None
    packed = cpu_gemm_bf16.pack(weight)
    assert packed.dtype == torch.int16 and packed.numel() == cpu_gemm_bf16.packed_numel(n, k)
    for rows in ROWS + ([PASS_ROWS[k]] if k in PASS_ROWS else []):
        x = torch.randn(rows, k).bfloat16()
        assert_rounded_once(cpu_gemm_bf16.linear(x, packed, b, n), x, weight, b)


@needs_kernel
@pytest.mark.parametrize("k", [301, 320])  # odd; whole AMX tiles
def test_rows_do_not_depend_on_the_batch_and_strided_rows_are_read(k):
    torch.manual_seed(0)
    weight = torch.randn(200, k).bfloat16()
    packed = cpu_gemm_bf16.pack(weight)
    wide = torch.randn(70, 400).bfloat16()
    x = wide[:, 50 : 50 + k]  # rows 400 apart
    full = cpu_gemm_bf16.linear(x, packed, None, 200)
    for rows in (1, 12, 13, 15, 16, 17, 33, 48, 49, 54):
        assert torch.equal(cpu_gemm_bf16.linear(x[:rows], packed, None, 200), full[:rows])
        assert torch.equal(cpu_gemm_bf16.linear(x[-rows:], packed, None, 200), full[-rows:])
    assert torch.equal(cpu_gemm_bf16.linear(x.contiguous(), packed, None, 200), full)
    three_d = cpu_gemm_bf16.linear(x.reshape(7, 10, k), packed, None, 200)
    assert three_d.shape == (7, 10, 200) and torch.equal(three_d.reshape(70, 200), full)
    assert cpu_gemm_bf16.linear(x[:0], packed, None, 200).shape == (0, 200)


@needs_kernel
def test_rows_of_several_passes_taking_the_weight_in_chunks_match_their_rows_alone():
    """Rows past one pass over W (696 at K = 3000) take a thread's pairs a chunk (2 MB) at a time,
    every pass in turn (1,000 columns: 6 MB of W). Each row as when it came alone."""
    torch.manual_seed(2)
    weight, x = torch.randn(1000, 3000).bfloat16(), torch.randn(800, 3000).bfloat16()
    packed = cpu_gemm_bf16.pack(weight)
    out = cpu_gemm_bf16.linear(x, packed, None, 1000)
    for r in (0, 695, 696, 799):
        assert torch.equal(cpu_gemm_bf16.linear(x[r : r + 1], packed, None, 1000), out[r : r + 1])


@needs_kernel
def test_one_thread_gives_the_same_result():
    torch.manual_seed(1)
    weight, x = torch.randn(640, 576).bfloat16(), torch.randn(59, 576).bfloat16()
    packed = cpu_gemm_bf16.pack(weight)
    threads = torch.get_num_threads()  # one under pytest-xdist: two are asked for here
    try:
        torch.set_num_threads(2)
        out = cpu_gemm_bf16.linear(x, packed, None, 640)
        torch.set_num_threads(1)
        assert torch.equal(cpu_gemm_bf16.linear(x, packed, None, 640), out)
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_a_mismatched_weight_or_dtype_is_refused():
    packed = cpu_gemm_bf16.pack(torch.randn(32, 16).bfloat16())
    with pytest.raises(ValueError, match="packed weight"):
        cpu_gemm_bf16.linear(torch.randn(2, 18).bfloat16(), packed, None, 32)
    with pytest.raises(TypeError, match="bfloat16"):
        cpu_gemm_bf16.linear(torch.randn(2, 16), packed, None, 32)
    with pytest.raises(TypeError, match="bfloat16"):
        cpu_gemm_bf16.pack(torch.randn(32, 16))


@pytest.mark.parametrize("march", [m for m in MARCHES if m != "native"])
def test_a_build_without_avx512_bf16_says_so(march):
    """AVX2 and baseline x86-64 builds have no dot-product instructions: Linear keeps oneDNN."""
    assert cpu_gemm_bf16.cpu_gemm_bf16_error(march) == "the compiler's target has no AVX512_BF16"
