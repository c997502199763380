"""Matmul over quantized weights for bfloat16 models (kernels/cpu_gemm_quant_bf16.c): y = x @ W.T
(+ bias) for x bfloat16 [M, K], W 4- or 8-bit integers in groups of a multiple of 32 along K with a
float32 scale (and optionally a minimum) each, as QuantizedWeight holds them; y is bit for bit the
dense bfloat16 path's (cpu_gemm_bf16) over the weight dequantized in float32 and rounded to
bfloat16, while the weight streams at its stored size.

It runs wherever that dense path is our own kernel: on AMX tiles where cpu_gemm_bf16 runs on AMX,
else on AVX512_BF16 dot products (an AVX-512 Zen 4 or 5: each thread dequantizes the panels it
takes into a scratch of its own and runs the dense kernel's micro-kernel there)."""

import ctypes
import functools
from types import SimpleNamespace

import torch

from pagedgen import envs
from pagedgen.kernels import cpu_gemm_bf16
from pagedgen.kernels.cpu_build import build_error, declare, load_amx_library, load_cpu_library
from pagedgen.kernels.cpu_features import kernel_march
from pagedgen.kernels.cpu_gemm import activation_rows, check_packed, output_of
from pagedgen.kernels.huge_pages import empty_huge

SOURCE = "cpu_gemm_quant_bf16.c"
EXTRA_FLAGS = ("-ffp-contract=off",)  # a dequantized weight's product and sum round apart
PANEL_WIDTH = 16  # NR in the source
K_MULTIPLE = 32  # k a tile step
# Rows from which the dense kernel's passes run over the weight dequantized a chunk at a time
# (their 2 x 2 tiles beat the tile steps here on prompts; SmolLM2's and Llama-3.2-1B's shapes,
# 2 threads of a Sapphire Rapids-class Xeon: 0.73-0.94x at 256-1,024 rows, 1.0-1.7x up to 64).
DENSE_MIN_ROWS = 512


_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_LINEAR = [_P, _I64, _P, _I64, _P, _P, _I64, _I64, _I64, _I32, _I64, _I32, _I32]


def _declare(lib: ctypes.CDLL, entry_points: tuple[str, ...]) -> SimpleNamespace:
    signatures = {
        "cpu_gemm_quant_bf16_supported": [],
        "pack_weight_quant_bf16": [_P, _P, _P, _P, _I64, _I64, _I32, _I64],
    }
    namespace = declare(lib, {**signatures, **{name: _LINEAR for name in entry_points}})
    lib.quant_bf16_panel_bytes.argtypes = [_I64, _I32, _I64, _I32]
    lib.quant_bf16_panel_bytes.restype = _I64
    namespace.panel_bytes = lib.quant_bf16_panel_bytes
    return namespace


@functools.cache
def _amx_library() -> SimpleNamespace:
    lib = load_amx_library(SOURCE, extra_flags=EXTRA_FLAGS)
    return _declare(lib, ("linear_quant_bf16_amx", "linear_quant_bf16_amx_dense"))


@functools.cache
def _dot_library(march: str) -> SimpleNamespace:
    return _declare(load_cpu_library(SOURCE, march, EXTRA_FLAGS), ("linear_quant_bf16_dot",))


def on_tiles() -> bool:
    """Whether the kernel runs on AMX tiles here (else on AVX512_BF16 dot products): where the
    dense bfloat16 path does."""
    return cpu_gemm_bf16.amx_error() is None


def _library() -> SimpleNamespace:
    return _amx_library() if on_tiles() else _dot_library(kernel_march())


@functools.cache
def error() -> str | None:
    """None when the kernel runs here (not disabled, and the dense bfloat16 path it matches is
    our own kernel, on AMX tiles or AVX512_BF16 dot products), else why not."""
    if envs.disable_cpu_gemm():
        return "disabled by PAGEDGEN_DISABLE_CPU_GEMM"
    if not cpu_gemm_bf16.enabled():
        return "the bfloat16 panel kernel is off (or oneDNN's AMX kernels run instead)"
    build = build_error(_library)
    if build is None and not _library().cpu_gemm_quant_bf16_supported():
        return "the compiler's target has no AVX512_BF16"
    return build


def path_name() -> str:
    """What the kernel computes on here: "bfloat16 tiles" or "bfloat16 dot products"."""
    return "bfloat16 tiles" if on_tiles() else "bfloat16 dot products"


def takes(bits: int, group_size: int, in_features: int) -> bool:
    """Whether the kernel runs a layer of this format here."""
    return (
        bits in (4, 8)
        and group_size % K_MULTIPLE == 0
        and in_features % group_size == 0
        and error() is None
    )


def pack(
    qweight: torch.Tensor,  # int8 [N, K], or uint8 [N, K // 2] of two 4-bit values a byte
    scales: torch.Tensor,  # float32 [N, K // group_size]
    mins: torch.Tensor | None,  # float32 [N, K // group_size] or None
    bits: int,
    group_size: int,
) -> torch.Tensor:
    """The weight as linear() reads it: uint8 [ceil(N / 16) * panel bytes], in huge pages where
    it fills one."""
    n, k = qweight.shape[0], qweight.shape[1] * (2 if bits == 4 else 1)
    lib = _library()
    out = empty_huge(
        -(-n // PANEL_WIDTH) * lib.panel_bytes(k, bits, group_size, mins is not None), torch.uint8
    )
    qweight, scales = qweight.contiguous(), scales.float().contiguous()
    mins = None if mins is None else mins.float().contiguous()
    status = lib.pack_weight_quant_bf16(
        out.data_ptr(),
        qweight.data_ptr(),
        scales.data_ptr(),
        None if mins is None else mins.data_ptr(),
        n,
        k,
        bits,
        group_size,
    )
    if status != 0:
        raise ValueError(
            f"{bits}-bit weights in groups of {group_size} over {k} inputs: not packable"
        )
    return out


def linear(
    x: torch.Tensor,  # [..., K] bfloat16
    packed: torch.Tensor,  # uint8, as pack() returned it
    bias: torch.Tensor | None,  # [N] bfloat16
    out_features: int,
    bits: int,
    group_size: int,
    has_mins: bool,
    out: torch.Tensor | None = None,  # [M, >= N] bfloat16, unit column stride: y goes there
) -> torch.Tensor:
    """x @ W.T (+ bias), bfloat16 [..., N]; with out, written into out[:, :N] instead. Runs for
    every projection of every layer, so its checks stay cheap."""
    rows = activation_rows(x, (torch.bfloat16,))
    m, k = rows.shape
    lib = _library()
    panel_bytes = lib.panel_bytes(k, bits, group_size, has_mins)
    check_packed(
        packed, torch.uint8, -(-out_features // PANEL_WIDTH) * panel_bytes, out_features, k
    )
    if bias is not None:
        if bias.dtype != torch.bfloat16 or bias.shape != (out_features,):
            raise ValueError(f"bias must be bfloat16 [{out_features}]")
        bias = bias.contiguous()  # held: the C call reads it
    y = torch.empty(m, out_features, dtype=torch.bfloat16) if out is None else out
    assert y.dtype == torch.bfloat16 and y.stride(-1) == 1 and y.shape[0] == m, y.shape
    if m:
        if not on_tiles():
            entry = lib.linear_quant_bf16_dot
        elif m >= DENSE_MIN_ROWS:
            entry = lib.linear_quant_bf16_amx_dense
        else:
            entry = lib.linear_quant_bf16_amx
        status = entry(
            y.data_ptr(),
            y.stride(0),
            rows.data_ptr(),
            rows.stride(0),
            packed.data_ptr(),
            None if bias is None else bias.data_ptr(),
            m,
            out_features,
            k,
            bits,
            group_size,
            has_mins,
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(f"the quantized bfloat16 matmul failed with status {status}")
    return output_of(y, x, out, out_features)
