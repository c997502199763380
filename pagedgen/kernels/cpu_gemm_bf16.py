"""bfloat16 matmul on CPUs with AVX512_BF16: the weight packed once into 16-column panels of k
pairs, then y = x @ W.T (+ bias) for bfloat16 x, summed in float32 and rounded once to bfloat16.
Rows never depend on the batch. Packed weights are int16 bits, which a module's .to() leaves
alone.

Two kernels read the panels. kernels/cpu_gemm_bf16.c sums with AVX512_BF16 dot-product
instructions, 6 rows by 64 columns a tile: at 1-64 rows 1.0-1.3x oneDNN's bfloat16 kernels on
two Zen 4 cores, about even at 512. On a CPU with AMX tiles, kernels/cpu_gemm_amx.c takes every
layer whose K is a multiple of 32 (the others keep the dot-product kernel): at decode batches it
streams the weights 1.1-1.25x faster than oneDNN's AMX kernels.

A float32 model whose weights are all bfloat16 values (a bfloat16 checkpoint run in float32) can
keep them in these panels on a CPU with AMX: linear_float32() splits each row of x into three
bfloat16 parts that hold all of its bits and sums their products in float32 on the tiles (a
float32 matmul in an order of its own, at three times the bfloat16 work: still 1.6-2.3x the float32
panel kernel's speed), over half the weight bytes of float32 panels.

Used wherever the dot-product kernel builds (the target needs AVX512_BF16), except on a CPU with
AMX where the AMX kernel does not build: oneDNN's AMX kernels are faster than ours without tiles.
PAGEDGEN_DISABLE_CPU_GEMM=1 turns both off, as it does the float32 panel kernel."""

import ctypes
import functools
from types import SimpleNamespace

import torch

from pagedgen import envs
from pagedgen.kernels import cpu_features, cpu_gemm
from pagedgen.kernels.cpu_build import (
    build_error,
    declare,
    load_amx_library,
    load_cpu_library,
)
from pagedgen.kernels.cpu_features import kernel_march
from pagedgen.kernels.cpu_gemm import activation_rows, check_packed, output_of
from pagedgen.kernels.huge_pages import empty_huge

SOURCE = "cpu_gemm_bf16.c"
AMX_SOURCE = "cpu_gemm_amx.c"
PANEL_WIDTH = 16  # NR in the source
AMX_K_MULTIPLE = 32  # k in one tile: the AMX kernel takes whole tiles only
LINEAR_TYPES = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3 + [ctypes.c_int]


@functools.cache
def _library(march: str) -> SimpleNamespace:
    lib = load_cpu_library(SOURCE, march)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    signatures = {
        "cpu_gemm_bf16_supported": [],
        "pack_weight_bf16": [p, p, i64, i64],
        "linear_bf16": LINEAR_TYPES,
    }
    return declare(lib, signatures)


@functools.cache
def _amx_library() -> SimpleNamespace:
    signatures = {"linear_bf16_amx": LINEAR_TYPES, "linear_f32_amx": LINEAR_TYPES}
    return declare(load_amx_library(AMX_SOURCE), signatures)


@functools.cache
def cpu_gemm_bf16_error(march: str | None = None) -> str | None:
    """None when the kernel builds here with its AVX512_BF16 path, else why not."""
    march = march or kernel_march()
    error = build_error(lambda: _library(march))
    if error is not None or _library(march).cpu_gemm_bf16_supported():
        return error
    return "the compiler's target has no AVX512_BF16"


@functools.cache
def amx_error() -> str | None:
    """None when the AMX kernel (kernels/cpu_gemm_amx.c) runs here, else why not."""
    return build_error(_amx_library)


@functools.cache
def enabled() -> bool:
    """Read once per process: the dot-product kernel built here, not disabled, and on a CPU with
    AMX tiles our AMX kernel too: without it oneDNN's AMX kernels are faster than ours."""
    if envs.disable_cpu_gemm() or cpu_gemm_bf16_error(kernel_march()) is not None:
        return False
    if amx_error() is None:
        return True
    amx = cpu_features.has_amx_bf16()
    return not (amx and torch.bfloat16 in cpu_features.onednn_matmul_dtypes())


def float32_amx(in_features: int) -> bool:
    """Whether linear_float32 runs here for a layer of in_features inputs: AMX, and K a multiple
    of 32."""
    return in_features % AMX_K_MULTIPLE == 0 and enabled() and amx_error() is None


def takes_float32(weight: torch.Tensor) -> bool:
    """Whether linear_float32 computes a float32 model's layer of this [N, K] weight here:
    float32_amx, and every value of the weight a bfloat16 one (its low 16 bits zero)."""
    return (
        weight.dtype in (torch.float32, torch.bfloat16)
        and weight.device.type == "cpu"
        and weight.dim() == 2
        and float32_amx(weight.shape[1])
        and (weight.dtype == torch.bfloat16 or cpu_gemm.bfloat16_valued(weight))
    )


def packed_numel(out_features: int, in_features: int) -> int:
    return -(-out_features // PANEL_WIDTH) * PANEL_WIDTH * 2 * ((in_features + 1) // 2)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] bfloat16 -> the panels [ceil(N / 16)][ceil(K / 2)][16][2] that linear() reads, as
    int16 bits, in huge pages where the weight fills one (see pagedgen.kernels.huge_pages)."""
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or weight.dim() != 2:
        raise TypeError(f"expected a 2-D bfloat16 CPU weight, got {weight.dtype} {weight.shape}")
    weight = weight.contiguous()
    n, k = weight.shape
    out = empty_huge(packed_numel(n, k), torch.int16)
    _library(kernel_march()).pack_weight_bf16(out.data_ptr(), weight.data_ptr(), n, k)
    return out


def linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """x @ W.T (+ bias) for x [..., K] bfloat16, W as pack() returned it; bfloat16 out. Runs for
    every projection of every layer, so its checks stay cheap."""
    return _linear(x, packed, bias, out_features, torch.bfloat16)


def linear_float32(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """x @ W.T (+ bias) for x [..., K] float32 on AMX, W as pack() returned it; float32 out (see
    the module's docstring). K is a multiple of 32."""
    return _linear(x, packed, bias, out_features, torch.float32)


def _linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    bias: torch.Tensor | None,
    out_features: int,
    dtype: torch.dtype,  # x's, bias's and y's
) -> torch.Tensor:
    name = str(dtype).removeprefix("torch.")
    rows = activation_rows(x, (dtype,))
    m, k = rows.shape
    check_packed(packed, torch.int16, packed_numel(out_features, k), out_features, k)
    if bias is not None:
        if bias.dtype != dtype or bias.shape != (out_features,):
            raise ValueError(f"bias must be {name} [{out_features}]")
        bias = bias.contiguous()  # held: the C call reads it
    y = torch.empty(m, out_features, dtype=dtype)
    if m:
        if dtype == torch.float32:
            kernel = _amx_library().linear_f32_amx
        elif k % AMX_K_MULTIPLE == 0 and amx_error() is None:
            kernel = _amx_library().linear_bf16_amx
        else:
            kernel = _library(kernel_march()).linear_bf16
        status = kernel(
            y.data_ptr(),
            rows.data_ptr(),
            rows.stride(0),
            packed.data_ptr(),
            None if bias is None else bias.data_ptr(),
            m,
            out_features,
            k,
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(f"{kernel.fn.__name__} failed with status {status}")
    return output_of(y, x, None, out_features)
