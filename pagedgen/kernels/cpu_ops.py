"""The decoder's fused elementwise ops for float32 and bfloat16 activations on the CPU
(kernels/cpu_ops.c): rms_norm, fused_add_rms_norm, silu_and_mul and rotary_embedding_and_cache,
each one pass over memory where the torch path runs several ops; and the greedy sampler's
argmax. bfloat16 rows compute in float32 and round where the torch ops round. Callers check
usable() and keep the torch path for everything else (other dtypes, GPUs, no C compiler)."""

import ctypes
import functools
from collections.abc import Callable
from types import SimpleNamespace

import torch

from pagedgen import envs
from pagedgen.kernels.cpu import KV_DTYPE_CODES
from pagedgen.kernels.cpu_build import build_error, declare, load_cpu_library
from pagedgen.kernels.cpu_features import kernel_march

SOURCE = "cpu_ops.c"
# Products and sums round as torch's ops round them (no fused multiply-adds).
EXTRA_FLAGS = ("-ffp-contract=off",)
ACTIVATION_SUFFIXES = {torch.float32: "f32", torch.bfloat16: "bf16"}  # dtype -> entry points


@functools.cache
def _library(march: str) -> SimpleNamespace:
    lib = load_cpu_library(SOURCE, march, EXTRA_FLAGS)
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    rope = [i32, p, i64, p, p, i64, i32, i32, i32, i32, p, p, p]
    signatures = {"rotary_embedding_and_cache_has_float16": []}
    for suffix in ACTIVATION_SUFFIXES.values():
        signatures |= {
            f"rms_norm_{suffix}": [p, p, i64, p, i64, i64, f32],
            f"fused_add_rms_norm_{suffix}": [p, p, p, i64, i64, f32],
            f"silu_and_mul_{suffix}": [p, p, i64, i64],
            f"rotary_embedding_and_cache_{suffix}": rope,
            f"argmax_{suffix}": [p, p, i64, i64, i64],
        }
    return declare(lib, signatures)


@functools.cache
def cpu_ops_error(march: str | None = None) -> str | None:
    """None when the ops compile and load here, else why not."""
    return build_error(lambda: _library(march or kernel_march()))


@functools.cache
def _enabled() -> bool:
    """Read once per process: built here and not switched off."""
    return not envs.disable_cpu_ops() and cpu_ops_error() is None


def usable(x: torch.Tensor) -> bool:
    """Whether the fused ops serve x: float32 or bfloat16 on the CPU, built here, not switched
    off."""
    return x.dtype in ACTIVATION_SUFFIXES and x.is_cpu and _enabled()


def _entry(name: str, *tensors: torch.Tensor) -> Callable[..., int]:
    """The entry point name_f32 or name_bf16 for tensors all of one activation dtype."""
    dtype = tensors[0].dtype
    for t in tensors:
        if t.dtype != dtype or dtype not in ACTIVATION_SUFFIXES or not t.is_cpu:
            raise TypeError(
                f"expected float32 or bfloat16 CPU tensors of one dtype, got {t.dtype} on "
                f"{t.device} beside {dtype}"
            )
    return getattr(_library(kernel_march()), f"{name}_{ACTIVATION_SUFFIXES[dtype]}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) * weight over the last dim; x: [rows, dim], each row contiguous."""
    kernel = _entry("rms_norm", x, weight)
    rows, dim = x.shape
    if x.stride(1) != 1 or weight.shape != (dim,) or not weight.is_contiguous():
        raise ValueError("x rows and weight must be contiguous, weight of x's last dim")
    out = torch.empty(rows, dim, dtype=x.dtype)
    kernel(out.data_ptr(), x.data_ptr(), x.stride(0), weight.data_ptr(), rows, dim, eps)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    """In place: residual += x, then x = rms_norm(residual) * weight. Both [rows, dim],
    contiguous."""
    kernel = _entry("fused_add_rms_norm", x, residual, weight)
    rows, dim = x.shape
    if residual.shape != x.shape or weight.shape != (dim,):
        raise ValueError(f"x {tuple(x.shape)}, residual {tuple(residual.shape)}: shapes differ")
    if not (x.is_contiguous() and residual.is_contiguous() and weight.is_contiguous()):
        raise ValueError("x, residual and weight must be contiguous")
    kernel(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), rows, dim, eps)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for rows [gate | up]: [rows, 2 * d] contiguous -> [rows, d]."""
    kernel = _entry("silu_and_mul", gate_up)
    rows, width = gate_up.shape
    if width % 2 or not gate_up.is_contiguous():
        raise ValueError("gate_up must be contiguous rows of even width")
    out = torch.empty(rows, width // 2, dtype=gate_up.dtype)
    kernel(out.data_ptr(), gate_up.data_ptr(), rows, width // 2)
    return out


def rotary_embedding_and_cache(
    qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim], rotated in place
    cos: torch.Tensor | None,  # [num_tokens, rotary_dim // 2], contiguous; None: no rotation
    sin: torch.Tensor | None,
    num_heads: int,
    num_kv_heads: int,
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, every slot valid
) -> None:
    """Neox RoPE on the first rotary_dim (2 x cos's width: all, part or none) features of the q
    and k heads of fused QKV rows (in place), then each token's rotated K and its V written at
    its slot of the caches, rounded to the cache dtype as torch rounds."""
    kernel = _entry("rotary_embedding_and_cache", qkv)
    num_tokens, width = qkv.shape
    head_dim = key_cache.shape[-1]
    if width != (num_heads + 2 * num_kv_heads) * head_dim or qkv.stride(1) != 1:
        raise ValueError(f"qkv {tuple(qkv.shape)} does not hold {num_heads}+2x{num_kv_heads} heads")
    rotary_dim = 0 if cos is None else 2 * cos.shape[-1]
    if cos is not None:
        if sin is None or cos.dtype != torch.float32 or sin.dtype != torch.float32:
            raise TypeError("cos and sin must both be float32")
        if cos.shape != (num_tokens, rotary_dim // 2) or cos.shape != sin.shape:
            raise ValueError(f"cos/sin must be [{num_tokens}, rotary_dim // 2]")
        if rotary_dim > head_dim:
            raise ValueError(f"rotary_dim {rotary_dim} exceeds head_dim {head_dim}")
        if not (cos.is_contiguous() and sin.is_contiguous()):
            raise ValueError("cos and sin must be contiguous")
    if key_cache.shape[2:] != (num_kv_heads, head_dim) or value_cache.shape != key_cache.shape:
        raise ValueError(f"caches {tuple(key_cache.shape)} do not match the kv heads")
    if key_cache.dtype != value_cache.dtype or key_cache.dtype not in KV_DTYPE_CODES:
        raise TypeError(f"caches of {key_cache.dtype} and {value_cache.dtype}")
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("the caches must be contiguous")
    if slot_mapping.dtype != torch.int64 or slot_mapping.shape != (num_tokens,):
        raise ValueError("slot_mapping must be int64, one slot per token")
    status = kernel(
        KV_DTYPE_CODES[key_cache.dtype],
        qkv.data_ptr(),
        qkv.stride(0),
        0 if cos is None else cos.data_ptr(),
        0 if sin is None else sin.data_ptr(),
        num_tokens,
        num_heads,
        num_kv_heads,
        head_dim,
        rotary_dim,
        key_cache.data_ptr(),
        value_cache.data_ptr(),
        slot_mapping.contiguous().data_ptr(),
    )
    if status != 0:
        raise RuntimeError(f"rotary_embedding_and_cache failed with status {status}")


def argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) for [rows, n] with contiguous rows: each row's first index of its
    largest value, or of its first NaN; int64."""
    kernel = _entry("argmax", x)
    rows, n = x.shape
    if x.stride(1) != 1 or n < 1:
        raise ValueError("x rows must be contiguous and not empty")
    out = torch.empty(rows, dtype=torch.int64)
    kernel(out.data_ptr(), x.data_ptr(), x.stride(0), rows, n)
    return out
