"""Every environment variable pagedgen reads, read here and only when asked (never at import
time), as vLLM's envs.py. Options belong in EngineConfig and on the command line; what is left
here is where files go, the compiler and the CPU ISA cap, and switches for debugging.
docs/configuration.md lists them."""

import os
from pathlib import Path

PAGEDGEN_CACHE = "PAGEDGEN_CACHE"
PAGEDGEN_MAX_CPU_ISA = "PAGEDGEN_MAX_CPU_ISA"
PAGEDGEN_DISABLE_ONEDNN = "PAGEDGEN_DISABLE_ONEDNN"
PAGEDGEN_DISABLE_CPU_GEMM = "PAGEDGEN_DISABLE_CPU_GEMM"
PAGEDGEN_DISABLE_CPU_OPS = "PAGEDGEN_DISABLE_CPU_OPS"
PAGEDGEN_VLLM_BASELINE = "PAGEDGEN_VLLM_BASELINE"


def pagedgen_cache() -> Path | None:
    """PAGEDGEN_CACHE: where converted models and built kernels go (else $XDG_CACHE_HOME or
    ~/.cache, then pagedgen)."""
    value = os.environ.get(PAGEDGEN_CACHE)
    return Path(value) if value else None


def xdg_cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def max_cpu_isa() -> str:
    """PAGEDGEN_MAX_CPU_ISA, lower-cased: "avx2" or "avx512" caps the ISA of our CPU kernels and
    the paths that pick by ISA (as on a machine without more); "" leaves the machine's own."""
    return os.environ.get(PAGEDGEN_MAX_CPU_ISA, "").strip().lower()


def disable_onednn() -> bool:
    """PAGEDGEN_DISABLE_ONEDNN set and not 0: no oneDNN (mkldnn) matmuls on the CPU."""
    return os.environ.get(PAGEDGEN_DISABLE_ONEDNN, "0") not in ("", "0")


def disable_cpu_gemm() -> bool:
    """PAGEDGEN_DISABLE_CPU_GEMM=1: none of our C matmul kernels (cpu_gemm, cpu_gemm_bf16)."""
    return os.environ.get(PAGEDGEN_DISABLE_CPU_GEMM) == "1"


def disable_cpu_ops() -> bool:
    """PAGEDGEN_DISABLE_CPU_OPS=1: the torch ops, not our fused C ops (kernels/cpu_ops.py)."""
    return os.environ.get(PAGEDGEN_DISABLE_CPU_OPS) == "1"


def cc() -> str | None:
    """CC: the C compiler our CPU kernels are built with (else cc, gcc or clang)."""
    return os.environ.get("CC") or None


def hf_offline_set() -> bool:
    """Whether HF_DATASETS_OFFLINE or HF_HUB_OFFLINE is set, to any value: then the datasets
    library's own reading of them holds, else a hub id is read from the local cache only."""
    return "HF_DATASETS_OFFLINE" in os.environ or "HF_HUB_OFFLINE" in os.environ


def vllm_baseline() -> str | None:
    """PAGEDGEN_VLLM_BASELINE: the command `pagedgen bench` runs its vLLM baseline with."""
    return os.environ.get(PAGEDGEN_VLLM_BASELINE) or None
