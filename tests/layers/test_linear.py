import functools

import pytest
import torch

from pagedgen.kernels import cpu_features, cpu_gemm, cpu_gemm_bf16
from pagedgen.layers.linear import (
    ONEDNN,
    PAIR_PANELS,
    PAIR_PANELS_F32,
    PANELS,
    TRANSPOSED,
    Linear,
    dense_linear,
    describe_cpu_compute,
    gemm_rows,
    pack_linear_weights,
)

needs_onednn = pytest.mark.skipif(
    torch.float32 not in cpu_features.onednn_matmul_dtypes(), reason="no oneDNN linear here"
)


@pytest.fixture
def cpu_env(monkeypatch):
    """Sets PAGEDGEN_* variables for one test; the cached answers are asked again around it."""

    def set_env(**env: str) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        cpu_features.max_cpu_isa.cache_clear()
        cpu_features.onednn_matmul_dtypes.cache_clear()
        cpu_gemm.enabled.cache_clear()
        cpu_gemm_bf16.enabled.cache_clear()
        cpu_gemm_bf16.amx_error.cache_clear()

    yield set_env
    cpu_features.max_cpu_isa.cache_clear()
    cpu_features.onednn_matmul_dtypes.cache_clear()
    cpu_gemm.enabled.cache_clear()
    cpu_gemm_bf16.enabled.cache_clear()
    cpu_gemm_bf16.amx_error.cache_clear()


def make_linear(bias: bool, dtype: torch.dtype = torch.float32) -> tuple[Linear, torch.Tensor]:
    torch.manual_seed(0)
    layer = Linear(48, [32, 16], bias=bias).to(dtype)
    full = torch.randn(48, 48)
    layer.load_shard("weight", full[:32].to(dtype), 0)
    layer.load_shard("weight", full[32:].to(dtype), 1)
    if bias:
        layer.load_shard("bias", torch.arange(32.0).to(dtype), 0)
        layer.load_shard("bias", -torch.arange(16.0).to(dtype), 1)
    return layer, full


def expected_output(x: torch.Tensor, full: torch.Tensor, bias: bool) -> torch.Tensor:
    """x @ W.T (+ b) in float32 over the layer's (possibly rounded) weights, in x's dtype."""
    out = x.float() @ full.to(x.dtype).float().T
    if bias:
        out += torch.cat([torch.arange(32.0), -torch.arange(16.0)])
    return out.to(x.dtype)


@pytest.mark.parametrize("bias", [False, True])
def test_shards_land_in_their_columns(bias):
    layer, full = make_linear(bias)
    x = torch.randn(5, 48)
    torch.testing.assert_close(layer(x), expected_output(x, full, bias))


@needs_onednn
@pytest.mark.parametrize("bias", [False, True])
def test_packed_equals_dense_and_rows_do_not_depend_on_the_batch(bias):
    layer, _ = make_linear(bias)
    x = torch.randn(70, 48)
    dense = layer(x)
    assert pack_linear_weights(layer) == 1 and layer.packed
    packed = layer(x)
    torch.testing.assert_close(packed, dense, atol=1e-5, rtol=1e-5)
    for rows in (1, 3, 64):
        assert torch.equal(layer(x[:rows]), packed[:rows])
    with pytest.raises(AssertionError):
        layer.load_shard("weight", torch.zeros(32, 48))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_computes_in_float32_where_onednn_lacks_it(cpu_env, dtype):
    """What every AVX2-only CPU does (forced here with PAGEDGEN_MAX_CPU_ISA=avx2): no oneDNN
    kernel for the half dtype, so the engine computes in float32 and a half Linear stays dense."""
    cpu_env(PAGEDGEN_MAX_CPU_ISA="avx2")
    assert dtype not in cpu_features.onednn_matmul_dtypes()
    assert cpu_features.cpu_compute_dtype(dtype) == torch.float32
    assert cpu_features.cpu_compute_dtype(torch.float32) == torch.float32
    assert "no native" in describe_cpu_compute(dtype)
    layer, _ = make_linear(False, dtype)
    assert not layer.pack() and layer.weight.dtype == dtype


@pytest.mark.skipif(
    torch.bfloat16 not in cpu_features.onednn_matmul_dtypes(),
    reason="oneDNN has no bfloat16 kernel on this CPU (it needs AVX-512 or avx_ne_convert)",
)
@pytest.mark.parametrize("disable_gemm", ["0", "1"])
def test_bfloat16_packs_natively_where_onednn_has_it(cpu_env, disable_gemm):
    """bfloat16 computes in bfloat16: through our panels where AVX512_BF16 builds (not with
    PAGEDGEN_DISABLE_CPU_GEMM=1) and, on a CPU with AMX, our AMX kernel too; else through
    oneDNN."""
    cpu_env(PAGEDGEN_DISABLE_CPU_GEMM=disable_gemm)
    assert cpu_features.cpu_compute_dtype(torch.bfloat16) == torch.bfloat16
    layer, full = make_linear(True, torch.bfloat16)
    x = torch.randn(70, 48).to(torch.bfloat16)
    assert layer.pack()
    ours = disable_gemm == "0" and cpu_gemm_bf16.cpu_gemm_bf16_error() is None
    # AMX without our AMX kernel: oneDNN's AMX kernels
    ours = ours and (not cpu_features.has_amx_bf16() or cpu_gemm_bf16.amx_error() is None)
    assert layer.layout == (PAIR_PANELS if ours else ONEDNN)
    assert layer.weight.dtype == (torch.int16 if ours else torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected_output(x, full, True), atol=0.1, rtol=2e-2)
    for rows in (1, 3, 64):
        assert torch.equal(layer(x[:rows]), out[:rows])


@pytest.mark.skipif(cpu_gemm.cpu_gemm_error() is not None, reason="no panel kernel here")
@pytest.mark.parametrize("isa", ["avx2", None])
@pytest.mark.parametrize("bias", [False, True])
def test_float32_takes_the_panel_kernel_and_onednn_without_it(cpu_env, isa, bias):
    """Float32 weights pack for kernels/cpu_gemm.c on this CPU's ISA and on AVX2 (forced with
    PAGEDGEN_MAX_CPU_ISA=avx2 on an AVX-512 machine); PAGEDGEN_DISABLE_CPU_GEMM=1 gives them to
    oneDNN; both compute the same rows whatever the batch."""
    if isa:
        cpu_env(PAGEDGEN_MAX_CPU_ISA=isa)
    else:
        cpu_env()
    x = torch.randn(70, 48)
    layer, full = make_linear(bias)
    assert layer.pack() and layer.layout == PANELS
    panels = layer(x)
    torch.testing.assert_close(panels, expected_output(x, full, bias), atol=1e-5, rtol=1e-5)
    for rows in (1, 3, 64):
        assert torch.equal(layer(x[:rows]), panels[:rows])
    isa_name = "AVX-512" if cpu_features.has_avx512() else "AVX2"
    assert f"{isa_name} panel float32 matmuls" in describe_cpu_compute(torch.float32)

    cpu_env(PAGEDGEN_DISABLE_CPU_GEMM="1")
    layer, _ = make_linear(bias)
    expected_layout = ONEDNN if torch.float32 in cpu_features.onednn_matmul_dtypes() else TRANSPOSED
    layer.pack()
    assert layer.layout == expected_layout
    torch.testing.assert_close(layer(x), panels, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(cpu_gemm.cpu_gemm_error() is not None, reason="no panel kernel here")
def test_a_bfloat16_weight_computing_in_float32_keeps_half_size_panels(cpu_env):
    """A bfloat16 model on an AVX2 CPU computes in float32: its Linears pack bfloat16 panels
    (int16 bits, which the model's later .to(float32) leaves alone) and give the float32
    result over the widened weights."""
    cpu_env(PAGEDGEN_MAX_CPU_ISA="avx2")
    layer, _ = make_linear(True, torch.bfloat16)
    reference, _ = make_linear(True, torch.bfloat16)
    reference.float().pack()
    assert layer.pack(torch.float32) and layer.layout == PANELS
    layer.to(torch.float32)
    assert layer.weight.dtype == torch.int16 and layer.bias.dtype == torch.float32
    assert layer.weight.numel() == reference.weight.numel()  # 2 bytes each instead of 4
    x = torch.randn(9, 48)
    assert torch.equal(layer(x), reference(x))


def test_without_onednn_weights_stay_dense(cpu_env):
    cpu_env(PAGEDGEN_DISABLE_ONEDNN="1", PAGEDGEN_DISABLE_CPU_GEMM="1")
    assert cpu_features.cpu_compute_dtype(torch.bfloat16) == torch.float32
    layer, full = make_linear(True)
    assert not layer.pack() and not layer.packed
    x = torch.randn(5, 48)
    torch.testing.assert_close(layer(x), expected_output(x, full, True))


def test_a_bad_isa_cap_is_named(cpu_env):
    cpu_env(PAGEDGEN_MAX_CPU_ISA="sse9")
    with pytest.raises(ValueError, match="PAGEDGEN_MAX_CPU_ISA"):
        cpu_features.onednn_matmul_dtypes()


def test_load_param_adopts_a_matching_tensor_and_copies_any_other():
    """A whole unsharded weight in the parameter's dtype is used as is (no start-up copy); one
    in another dtype or a non-contiguous view is copied in, converted."""
    layer = Linear(8, 4)
    same = torch.randn(4, 8)
    layer.load_shard("weight", same)
    assert layer.weight.data_ptr() == same.data_ptr()

    other = Linear(8, 4)
    half = torch.randn(4, 8).to(torch.bfloat16)
    other.load_shard("weight", half)
    assert other.weight.dtype == torch.float32 and other.weight.data_ptr() != half.data_ptr()
    assert torch.equal(other.weight, half.float())

    strided = torch.randn(8, 4).t()
    other.load_shard("weight", strided)
    assert other.weight.is_contiguous() and torch.equal(other.weight, strided)


@pytest.mark.parametrize("amx", [False, True])
@pytest.mark.parametrize("amx_kernel", [False, True])
def test_amx_without_our_amx_kernel_leaves_bfloat16_to_onednn(
    cpu_env, monkeypatch, amx, amx_kernel
):
    """On a CPU with AMX tiles our panels need our AMX kernel: without it, the AVX512_BF16
    kernel steps aside for oneDNN's AMX ones."""
    flags = cpu_features.cpu_flags() - {"amx_bf16", "amx_tile"}
    flags |= {"avx512f", "avx512_bf16"} | ({"amx_bf16", "amx_tile"} if amx else set())
    cpu_env(PAGEDGEN_MAX_CPU_ISA="")  # as on such a CPU, whatever this run's cap
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: flags)
    onednn = functools.cache(lambda: (torch.bfloat16,))  # cleared by cpu_env as the real one
    monkeypatch.setattr(cpu_features, "onednn_matmul_dtypes", onednn)
    monkeypatch.setattr(cpu_gemm_bf16, "cpu_gemm_bf16_error", lambda march=None: None)
    amx_error = None if amx and amx_kernel else "no AMX kernel"
    monkeypatch.setattr(cpu_gemm_bf16, "amx_error", functools.cache(lambda: amx_error))
    cpu_gemm_bf16.enabled.cache_clear()
    ours = not amx or amx_kernel
    assert cpu_gemm_bf16.enabled() is ours
    kernel = ("AMX" if amx else "AVX512_BF16") + " panel" if ours else "oneDNN"
    assert describe_cpu_compute(torch.bfloat16).startswith(kernel)


def test_gemm_rows_are_few_shapes_with_little_padding():
    rows = [gemm_rows(n) for n in range(1, 4097)]
    assert all(m >= n for n, m in zip(range(1, 4097), rows))
    assert len(set(rows)) == 56
    assert max((m - n) / n for n, m in zip(range(64, 4097), rows[63:])) <= 0.5
    assert max((m - n) / n for n, m in zip(range(256, 4097), rows[255:])) <= 0.125
    assert gemm_rows(32) == 32 and gemm_rows(1025) == 1152


@pytest.mark.parametrize("num_rows", [1, 31, 590, 1025])
@pytest.mark.parametrize("bias", [False, True])
def test_padded_rows_give_the_rows_unpadded(num_rows: int, bias: bool):
    torch.manual_seed(num_rows)
    x, weight = torch.randn(num_rows, 48), torch.randn(40, 48)
    b = torch.randn(40) if bias else None
    out = dense_linear(x, weight, b, padded=True)
    assert out.shape == (num_rows, 40) and out.is_contiguous()
    torch.testing.assert_close(out, torch.nn.functional.linear(x, weight, b))


def test_the_cpu_never_pads(monkeypatch):
    monkeypatch.setattr(torch.nn.functional, "pad", lambda *args, **kwargs: pytest.fail("padded"))
    x = torch.randn(33, 8)
    torch.testing.assert_close(dense_linear(x, torch.eye(8), None), x)


@pytest.mark.skipif(cpu_gemm.cpu_gemm_error() is not None, reason="no panel kernel here")
@pytest.mark.parametrize("isa", ["avx2", None])
def test_float32_weights_of_bfloat16_values_pack_at_half_the_bytes(cpu_env, isa):
    """A bfloat16 checkpoint run in float32: the panel kernel gets bfloat16 panels and gives the
    float32 panels' bits (forced with PAGEDGEN_MAX_CPU_ISA=avx2 on a machine with more); where
    the AMX kernel runs it takes the layer, float32 accurate."""
    if isa:
        cpu_env(PAGEDGEN_MAX_CPU_ISA=isa)
    else:
        cpu_env()
    torch.manual_seed(1)
    weight = torch.randn(48, 64).bfloat16().float()
    layer = Linear(64, 48)
    layer.load_shard("weight", weight)
    x = torch.randn(70, 64)
    assert layer.pack(torch.float32) and layer.weight.dtype == torch.int16
    out = layer(x)
    if layer.layout == PANELS:
        assert torch.equal(out, cpu_gemm.linear(x, cpu_gemm.pack(weight), None, 48))
    else:
        assert layer.layout == PAIR_PANELS_F32 and cpu_gemm_bf16.amx_error() is None
        torch.testing.assert_close(out, x @ weight.T, atol=1e-5, rtol=1e-5)
    for rows in (1, 3, 64):
        assert torch.equal(layer(x[:rows]), out[:rows])
