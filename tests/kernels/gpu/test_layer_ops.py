"""The layer ops' kernels (RMSNorm, SiLU-and-mul, RoPE with the cache write) on a real GPU
against the torch ops they replace, and the layers dispatching to them. Skipped without a CUDA GPU
and CuPy."""

import pytest
import torch

from pagedgen.kernels import layer_ops, loader
from pagedgen.layers.activation import SiluAndMul
from pagedgen.layers.norm import RMSNorm
from tests.kernels.emulated.test_layer_ops import CHECKS, ULP, check_rope_and_cache
from tests.kernels.paged_cases import DTYPES, FP8_DTYPES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and loader.cupy_available()),
        reason="needs a CUDA GPU and CuPy (pip install 'pagedgen[cuda]')",
    ),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("source", CHECKS)
def test_layer_op_matches_torch_on_a_gpu(source: str, dtype: torch.dtype) -> None:
    CHECKS[source](dtype, loader.launch, "cuda")


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rope_and_cache_into_fp8_on_a_gpu(dtype: torch.dtype, cache_dtype: torch.dtype) -> None:
    check_rope_and_cache(dtype, loader.launch, "cuda", cache_dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_layers_take_the_kernels_on_a_gpu(dtype: torch.dtype) -> None:
    norm = RMSNorm(576, 1e-5).to("cuda", dtype)
    norm.weight.copy_(torch.randn(576))
    x, residual = (torch.randn(33, 576, device="cuda").to(dtype) for _ in range(2))
    assert layer_ops.usable(x)
    expected_residual = residual + x
    expected = norm._norm(expected_residual)
    out, new_residual = norm(x.clone(), residual)
    assert torch.equal(new_residual, expected_residual)
    torch.testing.assert_close(out, expected, atol=ULP[dtype], rtol=ULP[dtype])
    gate_up = torch.randn(33, 2 * 1536, device="cuda").to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    torch.testing.assert_close(SiluAndMul()(gate_up), expected, atol=ULP[dtype], rtol=ULP[dtype])
