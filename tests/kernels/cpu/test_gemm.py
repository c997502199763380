"""The panel matmul (kernels/cpu_gemm.c) against oneDNN's packed linear, which it replaces for
float32 on AVX2 and AVX-512 CPUs, for every build a machine of ours may run."""

import pytest
import torch
import torch.nn.functional as F

from pagedgen.kernels import cpu_features, cpu_gemm
from tests.kernels.cpu.test_paged_attention import MARCHES

AVX2_MARCHES = [m for m in MARCHES if m != "x86-64"]
pytestmark = pytest.mark.skipif(
    not AVX2_MARCHES or cpu_gemm.cpu_gemm_error() is not None,
    reason=f"no panel kernel here: {cpu_gemm.cpu_gemm_error()}",
)
# (N, K): SmolLM2's projections and head; N not a multiple of 16; K over one 1024-wide slice.
SHAPES = [(960, 576), (576, 1536), (49152, 576), (1000, 37), (7, 2500), (33, 3000)]
# 103 panels: 26 quads at up to two threads (AVX-512), the last of three panels, its last partial
SHAPES += [(1643, 96)]
ROWS = [1, 5, 6, 12, 13, 59, 100]  # below, at and past one tile (6 rows on AVX2, 12 on AVX-512)
PASS_ROWS = 700  # at K = 3000, past the 348 rows (4 MiB of x) read in one pass over W


@pytest.fixture(params=AVX2_MARCHES)
def march(request, monkeypatch):
    monkeypatch.setattr(cpu_gemm, "kernel_march", lambda: request.param)
    assert cpu_gemm.cpu_gemm_error(request.param) is None
    return request.param


def onednn_linear(x, weight, bias):
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 64)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_equals_onednn_bit_for_bit(march, shape, bias):
    """oneDNN's summation order for the build's ISA (K slices of 1024 on AVX2; of 512 or 1024 on
    AVX-512, bias last), so the engine's greedy tokens stay those of oneDNN and of vLLM's CPU
    backend. oneDNN runs this machine's ISA: a build for another (AVX2 on an AVX-512 machine)
    is checked against float64, as is a single row past K = 1536 on AVX-512, which oneDNN's
    one-row kernel splits its own way."""
    n, k = shape
    torch.manual_seed(n + k)
    weight, b = torch.randn(n, k) * 0.05, torch.randn(n) if bias else None
    packed = cpu_gemm.pack(weight)
    avx512 = "avx512f" in cpu_features.cpu_flags()
    same_isa = march == "native" or not avx512
    for rows in ROWS + ([PASS_ROWS] if k == 3000 else []):
        x = torch.randn(rows, k)
        out = cpu_gemm.linear(x, packed, b, n)
        exact = same_isa and torch.backends.mkldnn.is_available()
        if exact and not (avx512 and rows == 1 and k > 1536):
            assert torch.equal(out, onednn_linear(x, weight, b)), (shape, rows)
        else:
            exact = F.linear(x.double(), weight.double(), None if b is None else b.double())
            torch.testing.assert_close(out, exact.float(), rtol=1e-5, atol=1e-5)


def test_rows_do_not_depend_on_the_batch_and_strided_rows_are_read(march):
    torch.manual_seed(0)
    weight = torch.randn(200, 300)
    packed = cpu_gemm.pack(weight)
    wide = torch.randn(70, 400)
    x = wide[:, 50:350]  # rows 400 apart
    full = cpu_gemm.linear(x, packed, None, 200)
    for rows in (1, 6, 13, 48, 49):
        assert torch.equal(cpu_gemm.linear(x[:rows], packed, None, 200), full[:rows])
    assert torch.equal(cpu_gemm.linear(x.contiguous(), packed, None, 200), full)
    three_d = cpu_gemm.linear(x.reshape(7, 10, 300), packed, None, 200)
    assert three_d.shape == (7, 10, 200) and torch.equal(three_d.reshape(70, 200), full)
    assert cpu_gemm.linear(x[:0], packed, None, 200).shape == (0, 200)


def test_rows_of_several_passes_taking_the_weight_in_chunks_match_their_rows_alone(march):
    """Rows past one pass over W (348 at K = 3000) take a thread's panels a chunk (2 MB) at a
    time, every pass in turn (1,000 columns: 12 MB of W). Each two rows as when they came alone
    (one row alone takes AVX-512 oneDNN's one-row order)."""
    torch.manual_seed(2)
    weight, x = torch.randn(1000, 3000), torch.randn(700, 3000)
    packed = cpu_gemm.pack(weight)
    out = cpu_gemm.linear(x, packed, None, 1000)
    for r in (0, 346, 348, 698):
        assert torch.equal(cpu_gemm.linear(x[r : r + 2], packed, None, 1000), out[r : r + 2])


def test_one_thread_gives_the_same_result(march):
    torch.manual_seed(1)
    weight, x = torch.randn(640, 576), torch.randn(59, 576)
    packed = cpu_gemm.pack(weight)
    threads = torch.get_num_threads()  # one under pytest-xdist: two are asked for here
    try:
        torch.set_num_threads(2)
        out = cpu_gemm.linear(x, packed, None, 640)
        torch.set_num_threads(1)
        assert torch.equal(cpu_gemm.linear(x, packed, None, 640), out)
    finally:
        torch.set_num_threads(threads)


def test_a_mismatched_weight_is_refused():
    packed = cpu_gemm.pack(torch.randn(32, 16))
    with pytest.raises(ValueError, match="packed weight"):
        cpu_gemm.linear(torch.randn(2, 15), packed, None, 32)
    with pytest.raises(TypeError):
        cpu_gemm.linear(torch.randn(2, 16).double(), packed, None, 32)


@pytest.mark.skipif("x86-64" not in MARCHES, reason="not an x86-64 machine")
def test_a_build_without_avx2_says_so_and_is_not_used():
    """Baseline x86-64 has no AVX2/FMA: the kernel reports it, so Linear keeps oneDNN."""
    assert cpu_gemm.cpu_gemm_error("x86-64") == "the compiler's target has no AVX2/FMA"


@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (33, 3000)])
def test_bfloat16_panels_equal_the_float32_kernel_over_the_widened_weight(march, shape):
    """Widening bfloat16 is exact, so the half-size panels give the float32 result bit for bit."""
    n, k = shape
    torch.manual_seed(n)
    weight, bias = (torch.randn(n, k) * 0.05).to(torch.bfloat16), torch.randn(n)
    packed = cpu_gemm.pack(weight)
    assert packed.dtype == torch.int16 and packed.numel() == -(-n // 16) * 16 * k
    widened = cpu_gemm.pack(weight.float())
    for rows in ROWS:
        x = torch.randn(rows, k)
        out = cpu_gemm.linear(x, packed, bias, n)
        assert torch.equal(out, cpu_gemm.linear(x, widened, bias, n)), (shape, rows)
