"""Every kernels/*.cu compiles for sm_80 and sm_90, with nvcc offline and through NVRTC exactly as
the runtime compiles it (same source text, options, name expressions), without a GPU.

`python tests/kernels/test_compile.py` prints ptxas' registers and spills for every kernel.
"""

import functools
import inspect
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import pytest

from pagedgen.kernels.cache_ops import COPY_BLOCKS, RESHAPE_AND_CACHE
from pagedgen.kernels.launch import C_TYPES, KernelModule
from pagedgen.kernels.layer_ops import LAYER_OP_MODULES
from pagedgen.kernels.paged_attention import BLOCK_SIZES, HEAD_SIZES, paged_attention_module
from pagedgen.kernels.paged_attention_grouped import grouped_modules
from pagedgen.kernels.prefill_attention import prefill_attention_module
from pagedgen.kernels.source import kernel_names, kernel_source

ARCHS = ("80", "90")
SOURCES = [name for name in kernel_names() if name.endswith(".cu")]
# The grouped decode kernel's 162 instantiations take nvcc ~50 s an arch: ptxas checks them for
# the H100's sm_90 only (the other sources, for both archs, show the two agree on spills).
OFFLINE_BUILDS = [
    (source, arch)
    for source in SOURCES
    for arch in ARCHS
    if source != "paged_attention_grouped.cu" or arch == "90"
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
    """Every module the runtime may compile, for those head and block sizes."""
    attention = [
        make_module(dtype, head_size, block_size)
        for make_module in (paged_attention_module, prefill_attention_module)
        for dtype in C_TYPES
        for head_size in head_sizes
        for block_size in block_sizes
    ]
    grouped = grouped_modules(head_sizes, block_sizes)
    return [*attention, *grouped, RESHAPE_AND_CACHE, COPY_BLOCKS, *LAYER_OP_MODULES]


def nvrtc_modules() -> list[KernelModule]:
    """What NVRTC compiles in the tests: every source, dtype and group tile, at a few head and
    block sizes (the offline build and the mangled names cover every instantiation)."""
    return runtime_modules((64, 128, 256), (16,))


@functools.cache
def nvcc_builds() -> dict[tuple[str, str], dict[str, PtxasInfo]]:
    """nvcc -cubin -Xptxas -v of every source for every arch, all at once; per-kernel info."""
    work = Path(tempfile.mkdtemp(prefix="pagedgen-nvcc-"))
    processes = {}
    for source, arch in OFFLINE_BUILDS:
        path = work / source
        path.write_text(kernel_source(source))
        command = ["nvcc", "-cubin", f"-arch=sm_{arch}", "-std=c++17", "-Xptxas", "-v"]
        command += ["-o", str(work / f"{source}.sm_{arch}.cubin"), str(path)]
        processes[source, arch] = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    builds = {}
    for key, process in processes.items():
        output = process.communicate()[0]
        assert process.returncode == 0, f"nvcc failed on {key}:\n{output[-4000:]}"
        builds[key] = parse_ptxas(output)
    shutil.rmtree(work, ignore_errors=True)
    return builds


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
    from cupy._core import core
    from cupy.cuda import nvrtc

    options = core.assemble_cupy_compiler_options(module.options)
    options += tuple(option.format(arch=arch) for option in CUPY_ADDED)
    program = nvrtc.createProgram(kernel_source(module.source), module.source, [], [])
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
    for module in nvrtc_modules():
        cubin, lowered = nvrtc_compile(module, arch)
        missing = [name for name in lowered.values() if name.encode() not in cubin]
        assert not missing, f"{module.source} {module.defines}: no code for {missing}"
        wrong = [e for e, name in lowered.items() if not name.startswith(mangled(e))]
        assert not wrong, f"mangled() disagrees with NVRTC on {wrong}"


# Itanium mangling of the kernels' template arguments.
MANGLED_TYPES = {"float": "f", "__half": "6__half", "__nv_bfloat16": "13__nv_bfloat16"}
MANGLED_VALUES = {"true": "Lb1E", "false": "Lb0E"}


def mangled(name_expression: str) -> str:
    """pagedgen::k<T, 1, true> -> _ZN8pagedgen1kI<T>Li1ELb1EEEv: a template kernel's mangled
    name up to its parameter types (void return). NVRTC's lowered names check it."""
    kernel, args = name_expression.removeprefix("pagedgen::").rstrip(">").split("<")
    scalar, *rest = [arg.strip() for arg in args.split(",")]
    values = "".join(MANGLED_VALUES.get(v, f"Li{v}E") for v in rest)
    return f"_ZN8pagedgen{len(kernel)}{kernel}I{MANGLED_TYPES[scalar]}{values}EEv"


@requires_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_runtime_kernels_are_instantiated_in_source(arch: str) -> None:
    """nvcc sees no name expressions, so a kernel in its cubin was instantiated by the source:
    every module the runtime may compile finds its kernels there (sm_90 builds all sources)."""
    for module in runtime_modules():
        offline = nvcc_builds().get((module.source, arch), nvcc_builds()[module.source, "90"])
        missing = [
            name
            for name in module.name_expressions
            if not any(kernel.startswith(mangled(name)) for kernel in offline)
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
