"""Every kernels/*.cu compiles for sm_80 and sm_90, with nvcc offline and through NVRTC exactly as
the runtime compiles it (same source text, options, name expressions), without a GPU.

`python tests/kernels/test_compile.py` prints ptxas' registers and spills for every kernel.
Each build's report (nvcc) or cubin (NVRTC) is kept by content where the emulator keeps its
builds (build_cache_dir): a machine builds a kernel source once per text, options and compiler.
"""

import functools
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from pagedgen.kernels.attention_args import BLOCK_SIZES, HEAD_SIZES
from pagedgen.kernels.cache_ops import COPY_BLOCKS, reshape_and_cache_module
from pagedgen.kernels.launch import C_TYPES, KernelModule, cache_dtypes
from pagedgen.kernels.layer_ops import RMS_NORM, SILU_AND_MUL, rope_and_cache_module
from pagedgen.kernels.paged_attention import paged_attention_module
from pagedgen.kernels.paged_attention_grouped import (
    GROUP_TILES,
    group_tile,
    grouped_module,
    grouped_modules,
)
from pagedgen.kernels.paged_attention_mma import HEAD_SIZES as MMA_HEAD_SIZES
from pagedgen.kernels.paged_attention_mma import mma_modules
from pagedgen.kernels.prefill_attention import prefill_attention_module, prefill_mma_module
from pagedgen.kernels.source import kernel_names, kernel_source

try:
    from tests.kernels.emulator import cache_path, store
except ModuleNotFoundError:  # run as a script, from tests/kernels
    from emulator import cache_path, store

ARCHS = ("80", "90")
SOURCES = [name for name in kernel_names() if name.endswith(".cu")]
# The CUDA-core attention sources instantiate every (dtype, cache, head, block[, tile]): the
# grouped decode kernel alone 486 times, over a minute of nvcc an arch. ptxas checks those for
# the H100's sm_90 only (the other sources, for both archs, show the two agree on spills; NVRTC
# compiles them for sm_80 below).
SM90_ONLY = ("paged_attention.cu", "paged_attention_grouped.cu", "prefill_attention.cu")
OFFLINE_BUILDS = [
    (source, arch)
    for source in SOURCES
    for arch in ARCHS
    if source not in SM90_ONLY or arch == "90"
]
# The decode kernels with L2 prefetch on (l2_prefetch, kernels/kv_prefetch.cuh), for sm_90, keyed
# "<source>+prefetch": one build per runtime module at block size 16 (the prefetch is per KV
# block, whatever its size), each dtype with its own cache and every head size.
PREFETCH = "+prefetch"
PREFETCH_MODULES = [
    module
    for dtype in C_TYPES
    for module in [
        *(paged_attention_module(dtype, h, 16, l2_prefetch=True) for h in HEAD_SIZES),
        *(
            grouped_module(dtype, h, 16, tile, l2_prefetch=True)
            for h in HEAD_SIZES
            for tile in GROUP_TILES
            if tile == group_tile(tile, h)
        ),
    ]
]
OFFLINE_BUILDS += [
    (f"{s}{PREFETCH}", "90") for s in ("paged_attention.cu", "paged_attention_grouped.cu")
]
# What CuPy appends to a RawModule's options: cupy.cuda.compiler._compile_with_cache_cuda adds
# -ftz=true, _compile_using_nvrtc_no_warning the device's -arch=sm_XX and the execution space.
CUPY_ADDED = ("-ftz=true", "-arch=sm_{arch}", "--device-as-default-execution-space")


class PtxasInfo(NamedTuple):
    registers: int
    spill_stores: int
    spill_loads: int


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


class NvccBuild(NamedTuple):
    key: tuple[str, str]  # (source[+prefetch], arch)
    source: str
    defines: tuple[str, ...]  # -D macros; none: every instantiation the source makes


@functools.cache
def nvcc_builds() -> dict[tuple[str, str], dict[str, PtxasInfo]]:
    """nvcc -cubin -Xptxas -v of every offline build, a process per core, longest first;
    per-kernel info."""
    builds = [
        NvccBuild((source, arch), source, ())
        for source, arch in OFFLINE_BUILDS
        if not source.endswith(PREFETCH)
    ]
    builds += [
        NvccBuild((m.source + PREFETCH, "90"), m.source, m.defines) for m in PREFETCH_MODULES
    ]
    # The longest first: the three whole CUDA-core attention sources, other sources, modules.
    builds.sort(key=lambda build: (build.defines != (), build.source not in SM90_ONLY))
    work = Path(tempfile.mkdtemp(prefix="pagedgen-nvcc-"))
    for source in {build.source for build in builds}:
        (work / source).write_text(kernel_source(source))

    def compile_one(index: int) -> str:
        build = builds[index]
        options = [f"-arch=sm_{build.key[1]}", "-std=c++17", "-Xptxas", "-v"]
        options += [f"-D{define}" for define in build.defines]
        report = cache_path("nvcc-", ".txt", kernel_source(build.source), *options, _nvcc_version())
        if report.exists():
            return report.read_text()
        command = ["nvcc", "-cubin", *options, "-o", str(work / f"{index}.cubin")]
        result = subprocess.run(
            [*command, str(work / build.source)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert result.returncode == 0, f"nvcc failed on {build}:\n{result.stdout[-4000:]}"
        store(report, result.stdout.encode())
        return result.stdout

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        outputs = list(pool.map(compile_one, range(len(builds))))
    shutil.rmtree(work, ignore_errors=True)
    info: dict[tuple[str, str], dict[str, PtxasInfo]] = {}
    for build, output in zip(builds, outputs):
        info.setdefault(build.key, {}).update(parse_ptxas(output))
    return info


@functools.cache
def _nvcc_version() -> str:
    return subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout


def parse_ptxas(output: str) -> dict[str, PtxasInfo]:
    info = {}
    for chunk in re.split(r"Compiling entry function '", output)[1:]:
        name = chunk.split("'", 1)[0]
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", chunk)
        registers = re.search(r"Used (\d+) registers", chunk)
        assert spills and registers, chunk
        info[name] = PtxasInfo(int(registers[1]), int(spills[1]), int(spills[2]))
    return info


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


requires_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
requires_nvrtc = pytest.mark.skipif(
    nvrtc_unavailable() is not None, reason=str(nvrtc_unavailable())
)


@requires_nvcc
@pytest.mark.parametrize(("source", "arch"), OFFLINE_BUILDS)
def test_nvcc_compiles_without_spills(source: str, arch: str) -> None:
    kernels = nvcc_builds()[source, arch]
    assert kernels, f"{source} compiled to no kernel: a template without explicit instantiation"
    spilling = {
        name: info for name, info in kernels.items() if info.spill_stores or info.spill_loads
    }
    assert not spilling, f"ptxas spills registers in {spilling}"


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


requires_cxxfilt = pytest.mark.skipif(shutil.which("c++filt") is None, reason="no c++filt")


@functools.cache
def offline_kernels(source: str, arch: str) -> tuple[str, ...]:
    """The demangled kernels of nvcc's build of source for sm_<arch> (sm_90 builds all sources)."""
    builds = nvcc_builds()
    return tuple(demangled(list(builds.get((source, arch), builds[source, "90"]))).values())


@requires_nvcc
@requires_cxxfilt
@pytest.mark.parametrize("arch", ARCHS)
def test_runtime_kernels_are_instantiated_in_source(arch: str) -> None:
    """nvcc sees no name expressions, so a kernel in its cubin was instantiated by the source:
    every module the runtime may compile finds its kernels there."""
    for module in runtime_modules():
        kernels = offline_kernels(module.source, arch)
        missing = [
            name
            for name in module.name_expressions
            if not any(is_kernel(kernel, name) for kernel in kernels)
        ]
        assert not missing, f"{module.source}: {missing} are not instantiated explicitly"


@requires_nvcc
def test_grouped_kernels_instantiate_only_what_the_planner_picks() -> None:
    offline = nvcc_builds()["paged_attention_grouped.cu", "90"]
    names = {name for m in grouped_modules(HEAD_SIZES, BLOCK_SIZES) for name in m.name_expressions}
    assert len(offline) == len(names), "instantiations that the planner never picks"


@requires_nvrtc
def test_cupy_still_adds_the_options_we_replicate() -> None:
    from cupy.cuda import compiler

    text = inspect.getsource(compiler)
    for option in ("'-ftz=true'", "'--device-as-default-execution-space'", "f'-arch=sm_{arch}'"):
        assert option in text, f"CuPy no longer adds {option}; update CUPY_ADDED"


def print_ptxas_report() -> None:
    for (source, arch), kernels in sorted(nvcc_builds().items()):
        for name, info in sorted(kernels.items()):
            print(
                f"sm_{arch} {source:22} {name:110} {info.registers:4d} regs  "
                f"spills {info.spill_stores}/{info.spill_loads} B"
            )


if __name__ == "__main__":
    print_ptxas_report()
    sys.exit(0)
