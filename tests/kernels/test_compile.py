"""Every kernels/*.cu compiles for sm_80 and sm_90 through NVRTC exactly as the runtime compiles it
(same source text, options, name expressions), without a GPU; tests/kernels/test_compile_nvcc.py
compiles them with nvcc offline.

Each build's cubin is kept by content where the emulator keeps its builds (build_cache_dir): a
machine builds a kernel source once per text, options and compiler.
"""

import functools
import inspect
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from pagedgen.kernels.attention_args import BLOCK_SIZES, HEAD_SIZES
from pagedgen.kernels.cache_ops import COPY_BLOCKS, reshape_and_cache_module
from pagedgen.kernels.launch import C_TYPES, KernelModule, cache_dtypes
from pagedgen.kernels.layer_ops import RMS_NORM, SILU_AND_MUL, rope_and_cache_module
from pagedgen.kernels.paged_attention import paged_attention_module
from pagedgen.kernels.paged_attention_grouped import grouped_module, grouped_modules
from pagedgen.kernels.paged_attention_mma import HEAD_SIZES as MMA_HEAD_SIZES
from pagedgen.kernels.paged_attention_mma import mma_modules
from pagedgen.kernels.prefill_attention import prefill_attention_module, prefill_mma_module
from pagedgen.kernels.source import kernel_source

try:
    from tests.kernels.emulator import cache_path, store
except ModuleNotFoundError:  # run as a script, from tests/kernels
    from emulator import cache_path, store

ARCHS = ("80", "90")
# What CuPy appends to a RawModule's options: cupy.cuda.compiler._compile_with_cache_cuda adds
# -ftz=true, _compile_using_nvrtc_no_warning the device's -arch=sm_XX and the execution space.
CUPY_ADDED = ("-ftz=true", "-arch=sm_{arch}", "--device-as-default-execution-space")


def runtime_modules(
    head_sizes: tuple[int, ...] = HEAD_SIZES, block_sizes: tuple[int, ...] = BLOCK_SIZES
) -> list[KernelModule]:
    """Every module the runtime may compile, for those head and block sizes and every cache
    dtype."""
    pairs = [(dtype, cache_dtype) for dtype in C_TYPES for cache_dtype in cache_dtypes(dtype)]
    attention = [
        paged_attention_module(dtype, head_size, block_size, cache_dtype=cache_dtype)
        for dtype, cache_dtype in pairs
        for head_size in head_sizes
        for block_size in block_sizes
    ]
    attention += [
        prefill_attention_module(dtype, head_size, block_size, cache_dtype)
        for dtype, cache_dtype in pairs
        for head_size in head_sizes
        for block_size in block_sizes
    ]
    grouped = grouped_modules(head_sizes, block_sizes)
    grouped += mma_modules(head_sizes, block_sizes)
    grouped += [
        prefill_mma_module(dtype, head_size, block_size)
        for dtype in (torch.float16, torch.bfloat16)
        for head_size in head_sizes
        if head_size in MMA_HEAD_SIZES
        for block_size in block_sizes
    ]
    cache_writes = [
        make_module(dtype, cache_dtype)
        for make_module in (reshape_and_cache_module, rope_and_cache_module)
        for dtype, cache_dtype in pairs
    ]
    return [*attention, *grouped, *cache_writes, COPY_BLOCKS, RMS_NORM, SILU_AND_MUL]


def nvrtc_modules() -> list[KernelModule]:
    """What NVRTC compiles in the tests: every source, dtype and group tile at a few head and
    block sizes, and with fp8 caches and with L2 prefetch at head size 128 (the offline build and
    the demangled names cover every instantiation)."""
    auto = [m for m in runtime_modules((64, 128, 256), (16,)) if not has_fp8_cache(m)]
    prefetching = [
        module(dtype, 128, 16, *args, l2_prefetch=True)
        for dtype in C_TYPES
        for module, args in ((paged_attention_module, (512, None)), (grouped_module, (4, None)))
    ]
    return auto + [m for m in runtime_modules((128,), (16,)) if has_fp8_cache(m)] + prefetching


def has_fp8_cache(module: KernelModule) -> bool:
    return any(define.startswith("PAGEDGEN_CACHE_T=pagedgen::fp8") for define in module.defines)


def nvrtc_unavailable() -> str | None:
    try:
        from cupy._core import core
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception as e:  # ImportError, or the NVRTC library failing to load
        return f"CuPy's NVRTC is unavailable ({type(e).__name__}: {e}); pip install pagedgen[test]"
    includes = [o[2:] for o in core.assemble_cupy_compiler_options(()) if o.startswith("-I")]
    if not any((Path(d) / "cuda_fp16.h").is_file() for d in includes):
        return f"no cuda_fp16.h in CuPy's include paths {includes}; pip install nvidia-cuda-runtime"
    return None


@functools.cache
def nvrtc_compile(module: KernelModule, arch: str) -> tuple[bytes, dict[str, str]]:
    """Compiles like cupy.RawModule on an sm_<arch> device: the cubin and each name expression's
    lowered (mangled) name."""
    import cupy
    from cupy._core import core
    from cupy.cuda import nvrtc

    options = core.assemble_cupy_compiler_options(module.options)
    options += tuple(option.format(arch=arch) for option in CUPY_ADDED)
    text = kernel_source(module.source)
    version = f"{cupy.__version__} {nvrtc.getVersion()}"  # CuPy's headers, NVRTC's
    cubin_path = cache_path("nvrtc-", ".cubin", text, *options, *module.name_expressions, version)
    names_path = cubin_path.with_suffix(".json")
    if names_path.exists():
        return cubin_path.read_bytes(), json.loads(names_path.read_text())
    cubin, lowered = _nvrtc_build(module, text, options)
    store(cubin_path, cubin)
    store(names_path, json.dumps(lowered).encode())  # the names last: they mark the build whole
    return cubin, lowered


def _nvrtc_build(
    module: KernelModule, text: str, options: tuple[str, ...]
) -> tuple[bytes, dict[str, str]]:
    from cupy.cuda import nvrtc

    program = nvrtc.createProgram(text, module.source, [], [])
    try:
        for name in module.name_expressions:
            nvrtc.addNameExpression(program, name)
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError as e:
            pytest.fail(f"NVRTC failed on {module}:\n{e}\n{nvrtc.getProgramLog(program)}")
        lowered = {name: nvrtc.getLoweredName(program, name) for name in module.name_expressions}
        return nvrtc.getCUBIN(program), lowered
    finally:
        nvrtc.destroyProgram(program)


def nvrtc_compile_all(modules: list[KernelModule], arch: str) -> list[tuple[bytes, dict[str, str]]]:
    """nvrtc_compile of each module, a thread per core (NVRTC lets go of the GIL)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(lambda module: nvrtc_compile(module, arch), modules))


requires_nvrtc = pytest.mark.skipif(
    nvrtc_unavailable() is not None, reason=str(nvrtc_unavailable())
)


@requires_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
def test_nvrtc_compiles_runtime_modules(arch: str) -> None:
    modules = nvrtc_modules()
    for module, (cubin, lowered) in zip(modules, nvrtc_compile_all(modules, arch)):
        missing = [name for name in lowered.values() if name.encode() not in cubin]
        assert not missing, f"{module.source} {module.defines}: no code for {missing}"
        names = demangled(list(lowered.values()))
        wrong = [e for e in lowered if not is_kernel(names[lowered[e]], e)]
        assert not wrong, f"the kernels NVRTC lowered {wrong} to are not theirs"


def demangled(names: list[str]) -> dict[str, str]:
    """Each mangled name as c++filt reads it: void pagedgen::k<float, 64, true>(float*, ...)."""
    output = subprocess.run(
        ["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True
    ).stdout
    return dict(zip(names, output.splitlines(), strict=True))


def is_kernel(demangled_name: str, name_expression: str) -> bool:
    return demangled_name.startswith(f"void {name_expression}(")


@requires_nvrtc
def test_cupy_still_adds_the_options_we_replicate() -> None:
    from cupy.cuda import compiler

    text = inspect.getsource(compiler)
    for option in ("'-ftz=true'", "'--device-as-default-execution-space'", "f'-arch=sm_{arch}'"):
        assert option in text, f"CuPy no longer adds {option}; update CUPY_ADDED"
