"""What this CPU can do, asked at run time: its vector ISA, and the dtypes oneDNN's packed matmuls
take here. Our machines are all x86-64 with AVX2; some add AVX-512 with avx512_bf16 and
avx512_vnni. Everything runs on both, and picks its path from these answers.

PAGEDGEN_MAX_CPU_ISA=avx2 makes an AVX-512 machine take the AVX2 paths (as oneDNN's
ONEDNN_MAX_CPU_ISA does for oneDNN): the C kernel is built for x86-64-v3 and half-precision
models compute in float32. The tests use it to cover both paths on any machine.
"""

import functools
import platform

import torch

from pagedgen import envs

# The flags worth naming beside a CPU figure, in the order they are printed.
NOTABLE_FLAGS = ("avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16", "avx_ne_convert")
HALF_DTYPES = (torch.bfloat16, torch.float16)


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The kernel's feature flags of this CPU (empty where /proc/cpuinfo is missing)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@functools.cache
def max_cpu_isa() -> str | None:
    """The cap set by PAGEDGEN_MAX_CPU_ISA, lower-cased ("avx2"), or None. Read once per process,
    since every kernel call asks (through kernel_march): code that changes the variable later
    clears this cache."""
    value = envs.max_cpu_isa()
    if value and value not in ("avx2", "avx512"):
        raise ValueError(f"PAGEDGEN_MAX_CPU_ISA must be avx2 or avx512, got {value!r}")
    return value or None


def has_avx512() -> bool:
    return "avx512f" in cpu_flags() and max_cpu_isa() != "avx2"


def has_amx_bf16() -> bool:
    """AMX tiles with bfloat16 (Intel Xeon since Sapphire Rapids), which oneDNN's bfloat16
    matmuls use: 5-8x our AVX512_BF16 dot-product kernel at 8-256 rows on one. Any
    PAGEDGEN_MAX_CPU_ISA cap (avx512 too) leaves them out."""
    return {"amx_bf16", "amx_tile"} <= cpu_flags() and has_avx512() and max_cpu_isa() is None


def has_amx_int8() -> bool:
    """AMX tiles with int8 dot products (Intel Xeon since Sapphire Rapids); not under a cap."""
    return {"amx_int8", "amx_tile"} <= cpu_flags() and has_avx512() and max_cpu_isa() is None


def isa_name() -> str:
    """The ISA pagedgen's CPU paths use here, e.g. "AVX512 (avx512_bf16, avx512_vnni)", "AVX2"."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return machine or "unknown"
    flags = cpu_flags()
    if has_avx512():
        notable = [flag for flag in NOTABLE_FLAGS if flag in flags]
        return "AVX512" + (f" ({', '.join(notable)})" if notable else "")
    if "avx2" in flags:
        return "AVX2" + (" (capped by PAGEDGEN_MAX_CPU_ISA)" if "avx512f" in flags else "")
    return "x86-64 without AVX2"


def kernel_march() -> str:
    """The -march our C kernels are compiled for: the machine's own, unless capped."""
    if "avx512f" in cpu_flags() and max_cpu_isa() == "avx2":
        return "x86-64-v3"
    return "native"


def onednn_disabled() -> bool:
    return envs.disable_onednn()


@functools.cache
def onednn_matmul_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes torch's oneDNN packed linear runs in here, each proven by a tiny matmul.

    float32 wherever torch has oneDNN; bfloat16 needs avx512bw/vl/dq or avx_ne_convert (torch
    raises otherwise); float16 needs avx512_fp16, AMX-FP16 or avx_ne_convert.
    """
    if onednn_disabled() or not torch.backends.mkldnn.is_available():
        return ()
    supported = []
    for dtype in (torch.float32, *HALF_DTYPES):
        if dtype in HALF_DTYPES and max_cpu_isa() == "avx2":
            continue
        try:
            weight = torch.ones(2, 3, dtype=dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, 64)
            x = torch.ones(1, 3, dtype=dtype)
            out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        except (AttributeError, RuntimeError, NotImplementedError):
            continue
        if out.float().tolist() == [[3.0, 3.0]]:
            supported.append(dtype)
    return tuple(supported)


def cpu_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a model asked for in dtype computes in on this CPU: dtype itself where oneDNN has
    a matmul kernel for it, else float32 (torch's own half-precision matmul runs at about
    1 GFLOP/s on these CPUs). Then, as llama.cpp does on a CPU, the weights keep their dtype's
    values (widening is exact) and activations are float32; the KV cache stays in dtype, so
    attention reads half the bytes and the run is never slower than a float32 one."""
    if dtype not in HALF_DTYPES or dtype in onednn_matmul_dtypes():
        return dtype
    return torch.float32
