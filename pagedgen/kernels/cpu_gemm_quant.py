"""Matmul over quantized weights on CPUs (kernels/cpu_gemm_quant.c): y = x @ W.T (+ bias) for x
float32 or bfloat16 [M, K], W 4- or 8-bit integers in groups along K with a float32 scale (and
optionally a minimum) each, as pagedgen.layers.quantized_weight.QuantizedWeight holds them,
packed once into 16-column panels that a decode step streams at their stored size (the scales
and minimums in float16 where they all are float16 values, as GGUF's are).

x is quantized per row in blocks of the weight's granule (128, 64, 32 or 16 k: the largest that
divides its group) to about 15 bits, two int8 digits (or, for W8A8 weights, to 8 bits, one digit),
the integer dot products of the digits are exact and the float epilogue runs in a fixed order, so
the AVX-512 VNNI, AVX2 and plain-C builds give the same bits and a row's output never depends on
the batch. On a CPU with AMX-INT8 tiles the same source built with them runs two-digit batches of
AMX_MIN_ROWS rows and more on the tiles, with the same bits. PAGEDGEN_DISABLE_CPU_GEMM=1 turns it
off (the layers then dequantize), as it does the float kernels."""

import ctypes
import functools
from types import SimpleNamespace

import torch

from pagedgen import envs
from pagedgen.kernels.cpu_build import (
    build_error,
    declare,
    load_amx_library,
    load_cpu_library,
)
from pagedgen.kernels.cpu_features import kernel_march
from pagedgen.kernels.cpu_gemm import activation_rows, check_packed, output_of
from pagedgen.kernels.huge_pages import empty_huge

SOURCE = "cpu_gemm_quant.c"
# Bit for bit across ISAs: no reassociation, no fused multiply-adds the source does not write.
EXTRA_FLAGS = ("-fno-associative-math", "-ffp-contract=off")
PANEL_WIDTH = 16  # NR in the source
PATHS = {2: "AVX-512 VNNI", 3: "AVX2 + AVX-VNNI", 1: "AVX2", 0: "plain C"}
ACTIVATION_DTYPES = (torch.float32, torch.bfloat16)
# Rows from which the AMX build is the faster, by bits (K 2048, N 8192, one Sapphire Rapids core;
# 4-bit panels are widened to int8 for the tiles, which costs).
AMX_MIN_ROWS = {8: 2, 4: 6}
LINEAR_TYPES = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int]
LINEAR_TYPES += [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 3
LINEAR_TYPES += [ctypes.c_int, ctypes.c_int64] + [ctypes.c_int] * 4  # ... half, threads, digits


@functools.cache
def _library(march: str) -> SimpleNamespace:
    lib = load_cpu_library(SOURCE, march, EXTRA_FLAGS)
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    signatures = {
        "cpu_gemm_quant_path": [],
        "pack_weight_quant": [p, p, p, p, i64, i64, i32, i64, i32],
        "quantize_weight": [p, p, p, p, i32, i64, i64, i32, i64],
        "linear_quant": LINEAR_TYPES,
    }
    lib.quant_panel_bytes.argtypes = [i64, i32, i64, i32, i32]
    lib.quant_panel_bytes.restype = i64
    namespace = declare(lib, signatures)
    namespace.quant_panel_bytes = lib.quant_panel_bytes
    return namespace


@functools.cache
def _amx_library() -> SimpleNamespace:
    lib = load_amx_library(SOURCE, int8=True, extra_flags=EXTRA_FLAGS)
    return declare(lib, {"linear_quant_amx": LINEAR_TYPES})


@functools.cache
def amx_error() -> str | None:
    """None when the AMX-INT8 build runs here, else why not."""
    if kernel_march() != "native":  # (the library, cached, outlives a cap set later)
        return "PAGEDGEN_MAX_CPU_ISA caps the ISA below AMX"
    return build_error(_amx_library)


@functools.cache
def cpu_gemm_quant_error(march: str | None = None) -> str | None:
    """None when the kernel builds here (for march; default the machine's), else why not."""
    return build_error(lambda: _library(march or kernel_march()))


@functools.cache
def enabled() -> bool:
    """Read once per process: the kernel builds here and is not disabled."""
    return not envs.disable_cpu_gemm() and cpu_gemm_quant_error(kernel_march()) is None


def int8_activations_faster() -> bool:
    """Whether weights made for int8 activations (W8A8: QuantizedWeight.int8_activations) run
    here on one int8 digit of x: where AMX-INT8 tiles are not (on VNNI or AVX2, one digit does
    half the integer dot products of two: 1.5-1.85x the bfloat16 dot-product kernel's speed at
    16-400 rows of Llama-3-8B's shapes on a Zen 4). With tiles, a bfloat16 model's int8 layers
    run on bfloat16 tiles and a float32 model's on both digits, as other weights."""
    return amx_error() is not None


def path_name(march: str | None = None) -> str:
    """The build's instruction path: "AVX-512 VNNI", "AVX2 + AVX-VNNI", "AVX2" or "plain C" (+
    "AMX-INT8" for prompts)."""
    name = PATHS[_library(march or kernel_march()).cpu_gemm_quant_path()]
    return name + (", AMX-INT8" if march is None and amx_error() is None else "")


def float16_params(scales: torch.Tensor, mins: torch.Tensor | None) -> bool:
    """Whether every scale and minimum is a finite float16 value: then the panels hold them in
    float16 (widened exactly, the same outputs from fewer bytes)."""
    for part in (scales, mins):
        if part is not None:
            half = part.to(torch.float16)
            if not (half.isfinite().all() and torch.equal(half.float(), part.float())):
                return False
    return True


def check_format(in_features: int, bits: int, group_size: int) -> None:
    if bits not in (4, 8) or group_size % 16 or in_features % group_size:
        raise ValueError(
            f"{bits}-bit weights in groups of {group_size} over {in_features} inputs: the kernel"
            " takes 4 or 8 bits in groups of a multiple of 16 that divides the inputs"
        )


def pack(
    qweight: torch.Tensor,  # int8 [N, K], or uint8 [N, K // 2] of two 4-bit values a byte
    scales: torch.Tensor,  # float32 [N, K // group_size]
    mins: torch.Tensor | None,  # float32 [N, K // group_size] or None
    bits: int,
    group_size: int,
    half: bool = False,  # scales and mins in float16: they must be float16_params
    march: str | None = None,
) -> torch.Tensor:
    """The weight as linear() reads it: uint8 [ceil(N / 16) * panel bytes], in huge pages where
    it fills one (pagedgen.kernels.huge_pages)."""
    n = qweight.shape[0]
    k = qweight.shape[1] * (2 if bits == 4 else 1)
    check_format(k, bits, group_size)
    if half and not float16_params(scales, mins):
        raise ValueError("scales or mins that are not float16 values cannot be packed as float16")
    lib = _library(march or kernel_march())
    out = empty_huge(
        -(-n // PANEL_WIDTH) * lib.quant_panel_bytes(k, bits, group_size, mins is not None, half),
        torch.uint8,
    )
    dtype = torch.float16 if half else torch.float32
    qweight, scales = qweight.contiguous(), scales.to(dtype).contiguous()
    mins = None if mins is None else mins.to(dtype).contiguous()
    status = lib.pack_weight_quant(
        out.data_ptr(),
        qweight.data_ptr(),
        scales.data_ptr(),
        None if mins is None else mins.data_ptr(),
        n,
        k,
        bits,
        group_size,
        half,
    )
    assert status == 0, status
    return out


def quantize(
    weight: torch.Tensor,  # [N, K] float32 or bfloat16 (others are widened to float32)
    bits: int,
    group_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Online quantization in one pass a row: (qweight, scales, mins) as QuantizedWeight holds
    them. 8 bits: symmetric, q = round(w / s) in -127..127, s = max|w| / 127 a group, no mins.
    4 bits: q = round((w - min) / s) in 0..15, s = (max - min) / 15 a group. s and min are their
    nearest float16 values (where those are finite, and normal for s), so pack() holds them in
    float16."""
    if weight.dtype not in ACTIVATION_DTYPES:
        weight = weight.float()
    weight = weight.contiguous()
    n, k = weight.shape
    groups = k // group_size
    qweight = torch.empty(
        n, k if bits == 8 else k // 2, dtype=torch.int8 if bits == 8 else torch.uint8
    )
    scales = torch.empty(n, groups)
    mins = torch.empty(n, groups) if bits == 4 else None
    status = _library(kernel_march()).quantize_weight(
        qweight.data_ptr(),
        scales.data_ptr(),
        None if mins is None else mins.data_ptr(),
        weight.data_ptr(),
        weight.dtype == torch.bfloat16,
        n,
        k,
        bits,
        group_size,
    )
    if status != 0:
        raise ValueError(f"no {bits}-bit quantization in groups of {group_size} of {k} inputs")
    return qweight, scales, mins


def linear(
    x: torch.Tensor,  # [..., K] float32 or bfloat16
    packed: torch.Tensor,  # uint8, as pack() returned it
    bias: torch.Tensor | None,  # [N]
    out_features: int,
    bits: int,
    group_size: int,
    has_mins: bool,
    half: bool = False,  # as pack() was given it
    out: torch.Tensor | None = None,  # [M, >= N] in x's dtype, unit column stride: y goes there
    march: str | None = None,  # a build apart from the machine's (tests); never AMX
    digits: int = 2,  # x's int8 digits: 2 (about 15 bits), or 1 (8 bits: W8A8); AMX takes 2
) -> torch.Tensor:
    """x @ W.T (+ bias) in x's dtype ([..., N]); with out, written into out[:, :N] instead (a
    column range of a wider output: a fused layer's shard of another format). Runs for every
    projection of every layer, so its checks stay cheap."""
    rows = activation_rows(x, ACTIVATION_DTYPES)
    m, k = rows.shape
    lib = _library(march or kernel_march())
    panel_bytes = lib.quant_panel_bytes(k, bits, group_size, has_mins, half)
    check_packed(
        packed, torch.uint8, -(-out_features // PANEL_WIDTH) * panel_bytes, out_features, k
    )
    if bias is not None:
        bias = bias.float().contiguous()  # held: the C call reads it
    y = torch.empty(m, out_features, dtype=x.dtype) if out is None else out
    assert y.dtype == x.dtype and y.stride(-1) == 1 and y.shape[0] == m, (y.dtype, y.shape)
    kernel = lib.linear_quant
    if march is None and digits == 2 and m >= AMX_MIN_ROWS[bits] and amx_error() is None:
        kernel = _amx_library().linear_quant_amx
    if m:
        status = kernel(
            y.data_ptr(),
            x.dtype == torch.bfloat16,
            y.stride(0),
            rows.data_ptr(),
            x.dtype == torch.bfloat16,
            rows.stride(0),
            packed.data_ptr(),
            None if bias is None else bias.data_ptr(),
            m,
            out_features,
            k,
            bits,
            group_size,
            has_mins,
            half,
            torch.get_num_threads(),
            digits,
        )
        if status != 0:
            raise RuntimeError(f"{kernel.fn.__name__} failed with status {status}")
    return output_of(y, x, out, out_features)
