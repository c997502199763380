"""Every kernels/*.cu compiles for sm_80 and sm_90 with nvcc offline, without a GPU: no register
spills, and every kernel that the runtime may compile instantiated in its source (NVRTC compiles
them as the runtime does in tests/kernels/test_compile.py).

`python tests/kernels/test_compile_nvcc.py` prints ptxas' registers and spills for every kernel.
Each build's report is kept by content where the emulator keeps its builds (build_cache_dir): a
machine builds a kernel source once per text, options and compiler.
"""

import functools
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

from pagedgen.kernels.attention_args import BLOCK_SIZES, HEAD_SIZES
from pagedgen.kernels.launch import C_TYPES
from pagedgen.kernels.paged_attention import paged_attention_module
from pagedgen.kernels.paged_attention_grouped import (
    GROUP_TILES,
    group_tile,
    grouped_module,
    grouped_modules,
)
from pagedgen.kernels.source import kernel_names, kernel_source

try:
    from tests.kernels.emulator import cache_path, store
    from tests.kernels.test_compile import ARCHS, demangled, is_kernel, runtime_modules
except ModuleNotFoundError:  # run as a script, from tests/kernels
    from emulator import cache_path, store
    from test_compile import ARCHS, demangled, is_kernel, runtime_modules

SOURCES = [name for name in kernel_names() if name.endswith(".cu")]
# The CUDA-core attention sources instantiate every (dtype, cache, head, block[, tile]): the
# grouped decode kernel alone 486 times, over a minute of nvcc an arch. ptxas checks those for
# the H100's sm_90 only (the other sources, for both archs, show the two agree on spills; NVRTC
# compiles them for sm_80 in test_compile.py).
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


class PtxasInfo(NamedTuple):
    registers: int
    spill_stores: int
    spill_loads: int


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


requires_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


@requires_nvcc
@pytest.mark.parametrize(("source", "arch"), OFFLINE_BUILDS)
def test_nvcc_compiles_without_spills(source: str, arch: str) -> None:
    kernels = nvcc_builds()[source, arch]
    assert kernels, f"{source} compiled to no kernel: a template without explicit instantiation"
    spilling = {
        name: info for name, info in kernels.items() if info.spill_stores or info.spill_loads
    }
    assert not spilling, f"ptxas spills registers in {spilling}"


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
