"""Float32 matmul on AVX2 and AVX-512 CPUs (kernels/cpu_gemm.c): the weight packed once into
16-column panels, then y = x @ W.T (+ bias) with results bit-identical to oneDNN's packed linear
for the same ISA and faster (decode-sized batches gain most: 1.1-1.3x on AVX2, 1.05-1.17x on
AVX-512). A bfloat16 weight stays bfloat16 in its panels (half the bytes to read) and is widened
as it is loaded: the float32 result over the widened weight, bit for bit. Its panels are returned
as int16 bits, which a module's .to(float32) leaves alone, so a bfloat16 model widened to float32
keeps them half-size.

Used wherever it builds (the target needs AVX2 and FMA). PAGEDGEN_DISABLE_CPU_GEMM=1 turns it
off."""

import ctypes
import functools
from types import SimpleNamespace

import torch

from pagedgen import envs
from pagedgen.kernels.cpu_build import build_error, declare, load_cpu_library
from pagedgen.kernels.cpu_features import kernel_march

SOURCE = "cpu_gemm.c"
PANEL_WIDTH = 16  # NR in the source
WEIGHT_DTYPES = {torch.float32: torch.float32, torch.bfloat16: torch.int16}  # weight -> panels


@functools.cache
def _library(march: str) -> SimpleNamespace:
    lib = load_cpu_library(SOURCE, march)
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    signatures = {
        "cpu_gemm_supported": [],
        "pack_weight": [p, p, i64, i64, i32],
        "linear": [p, p, i64, p, i32, p, i64, i64, i64, i32],
    }
    return declare(lib, signatures)


@functools.cache
def cpu_gemm_error(march: str | None = None) -> str | None:
    """None when the kernel builds here with its AVX2/FMA path, else why not."""
    march = march or kernel_march()
    error = build_error(lambda: _library(march))
    if error is not None or _library(march).cpu_gemm_supported():
        return error
    return "the compiler's target has no AVX2/FMA"


@functools.cache
def enabled() -> bool:
    """Read once per process: built here (an AVX2 or AVX-512 target), not disabled."""
    return not envs.disable_cpu_gemm() and cpu_gemm_error(kernel_march()) is None


def bfloat16_valued(weight: torch.Tensor) -> bool:
    """Whether every value of a float32 weight is a bfloat16 one (its low 16 bits zero), as in a
    bfloat16 checkpoint run in float32: packed as bfloat16, the kernel widens them back, so its
    results are the same bits at half the bytes."""
    return weight.dtype == torch.float32 and not (weight.view(torch.int32) & 0xFFFF).any()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] float32 or bfloat16 -> the flat panel layout [ceil(N / 16) * K * 16] that linear()
    reads: float32, or int16 holding the bfloat16 bits."""
    if weight.dtype not in WEIGHT_DTYPES or weight.device.type != "cpu" or weight.dim() != 2:
        raise TypeError(
            f"expected a 2-D float32/bfloat16 CPU weight, got {weight.dtype} {weight.shape}"
        )
    weight = weight.contiguous()
    n, k = weight.shape
    out = torch.empty(-(-n // PANEL_WIDTH) * PANEL_WIDTH * k, dtype=WEIGHT_DTYPES[weight.dtype])
    size = weight.element_size()
    _library(kernel_march()).pack_weight(out.data_ptr(), weight.data_ptr(), n, k, size)
    return out


def activation_rows(x: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    """x [..., K] as the rows [M, K] a matmul kernel reads (unit column stride), once it is a CPU
    tensor of one of dtypes."""
    if x.dtype not in dtypes or x.device.type != "cpu":
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"expected {names} CPU activations, got {x.dtype} on {x.device}")
    rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def check_packed(
    packed: torch.Tensor, dtype: torch.dtype, numel: int, out_features: int, k: int
) -> None:
    """Raises ValueError unless packed has the dtype and size a weight of out_features x k packs
    to."""
    if packed.dtype != dtype or packed.numel() != numel:
        raise ValueError(
            f"packed weight of {packed.numel()} {packed.dtype} is not {out_features} x {k}"
        )


def output_of(
    y: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """A kernel's y [M, N] as its caller gets it: out where the caller gave one (y was written
    there), else y in x's leading shape."""
    if out is not None:
        return out
    return y if x.dim() == 2 else y.view(*x.shape[:-1], out_features)


def linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """x @ W.T (+ bias) for x [..., K] float32, W as pack() returned it; float32 out.
    Runs for every projection of every layer, so its checks stay cheap: at batch 1 they cost
    about as much as the matmul of a small projection."""
    rows = activation_rows(x, (torch.float32,))
    m, k = rows.shape
    if packed.numel() != -(-out_features // PANEL_WIDTH) * PANEL_WIDTH * k:
        raise ValueError(f"packed weight of {packed.numel()} floats is not {out_features} x {k}")
    bf16 = packed.dtype == torch.int16
    if not bf16 and packed.dtype != torch.float32:
        raise TypeError(f"packed weights are float32 or int16 (bfloat16 bits), not {packed.dtype}")
    if bias is not None:
        if bias.dtype != torch.float32 or bias.shape != (out_features,):
            raise ValueError(f"bias must be float32 [{out_features}]")
        bias = bias.contiguous()  # held: the C call reads it
    y = torch.empty(m, out_features)
    if m:
        status = _library(kernel_march()).linear(
            y.data_ptr(),
            rows.data_ptr(),
            rows.stride(0),
            packed.data_ptr(),
            int(bf16),
            None if bias is None else bias.data_ptr(),
            m,
            out_features,
            k,
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(f"cpu_gemm linear failed with status {status}")
    return output_of(y, x, None, out_features)
