"""Builds a C kernel from kernels/ for this CPU: compiled on first use with the machine's C
compiler, cached on disk, loaded with ctypes (whose calls release the GIL).

Built for -march=native (or the cap PAGEDGEN_MAX_CPU_ISA sets), with -fopenmp where the compiler
has it; loaded after torch, so its libgomp.so.1 is the one torch already runs and the kernels
share torch's threads (a second pool would spin against torch's on the same cores)."""

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

from pagedgen import envs
from pagedgen.kernels.cpu_features import cpu_flags, has_amx_bf16, has_amx_int8, kernel_march
from pagedgen.kernels.source import kernel_source
from pagedgen.paths import cache_dir

# Reassociation lets reductions vectorize; not -ffast-math, whose crtfastmath would turn on
# flush-to-zero for the whole process.
CFLAGS = (
    "-O3",
    "-fno-math-errno",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-fno-trapping-math",
    "-fPIC",
    "-shared",
)
OPENMP_FLAGS = ("-fopenmp",)


class CpuKernelUnavailable(RuntimeError):
    pass


def build_error(*builds: Callable[[], object]) -> str | None:
    """None when every build (a library's cached loader) compiles and loads here, else why the
    first that does not: no compiler or flags for the target, a failed load, a missing symbol."""
    try:
        for build in builds:
            build()
    except (CpuKernelUnavailable, OSError, AttributeError) as e:
        return str(e)
    return None


def c_compiler() -> str:
    for name in (envs.cc(), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise CpuKernelUnavailable("no C compiler found (set CC, or install gcc)")


def compile_source(compiler: str, name: str, source: str, flags: tuple[str, ...]) -> Path:
    """The cached shared library of source (kernels/<name>), compiled now if it is not there."""

    # -march=native code is only valid where the CPU has the same features.
    cpu_id = " ".join(sorted(cpu_flags())) or sys.platform
    key = hashlib.sha256("\0".join([source, compiler, *flags, cpu_id]).encode()).hexdigest()
    path = cache_dir() / "cpu_kernels" / f"{Path(name).stem}-{key[:16]}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        src = Path(tmp) / name
        src.write_text(source, encoding="utf-8")
        out = Path(tmp) / path.name
        result = subprocess.run(
            [compiler, *flags, str(src), "-o", str(out), "-lm"], capture_output=True, text=True
        )
        if result.returncode != 0:
            raise CpuKernelUnavailable(f"{compiler} failed on {name}:\n{result.stderr}")
        os.replace(out, path)  # atomic: concurrent processes never load a partial file
    return path


def march_flags(march: str) -> tuple[str, ...]:
    """-march for march, and -m for each feature after a "+": "x86-64-v3+avxvnni" is AVX2 with
    AVX-VNNI (as an AVX2 machine that has it builds natively)."""
    base, *features = march.split("+")
    return (f"-march={base}", *(f"-m{feature}" for feature in features))


@functools.cache
def load_cpu_library(name: str, march: str, extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """kernels/<name> built for march (see march_flags); raises CpuKernelUnavailable or OSError
    where it can't be."""
    compiler, source = c_compiler(), kernel_source(name)
    flags = (*CFLAGS, *extra_flags, *march_flags(march))
    try:
        path = compile_source(compiler, name, source, flags + OPENMP_FLAGS)
    except CpuKernelUnavailable:  # no OpenMP (Apple clang): one thread
        path = compile_source(compiler, name, source, flags)
    return ctypes.CDLL(str(path))


def load_amx_library(
    name: str, int8: bool = False, extra_flags: tuple[str, ...] = ()
) -> ctypes.CDLL:
    """kernels/<name> built with AMX tiles (bfloat16 ones, or with int8 the int8 ones); raises
    CpuKernelUnavailable where the CPU has none, or PAGEDGEN_MAX_CPU_ISA caps the ISA below them."""
    kind = "int8" if int8 else "bfloat16"
    if not (has_amx_int8() if int8 else has_amx_bf16()) or kernel_march() != "native":
        raise CpuKernelUnavailable(f"no AMX {kind} tiles here (or the ISA is capped below them)")
    tiles = "-mamx-int8" if int8 else "-mamx-bf16"
    return load_cpu_library(name, "native", (*extra_flags, "-mamx-tile", tiles))


# Called after every kernel call while record_calls() is open: (function, args, status).
CallObserver = Callable[[Callable[..., int], tuple, int], None]
_observer: CallObserver | None = None


@contextlib.contextmanager
def record_calls(observer: CallObserver) -> Iterator[None]:
    """Reports each kernel call made inside to observer, which may replay it later: the
    arguments are plain values (pointers as ints), valid as long as the tensors behind them."""
    global _observer
    previous, _observer = _observer, observer
    try:
        yield
    finally:
        _observer = previous


class KernelFunction:
    """A declared entry point of a kernel library: calls it, and reports the call where
    record_calls() asks."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., int]) -> None:
        self.fn = fn

    def __call__(self, *args) -> int:
        status = self.fn(*args)
        if _observer is not None:
            _observer(self.fn, args, status)
        return status


def declare(lib: ctypes.CDLL, signatures: dict[str, list[type]]) -> SimpleNamespace:
    """The named functions with their argument types set; every kernel entry point returns an
    int."""
    functions = {}
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
        functions[name] = KernelFunction(fn)
    return SimpleNamespace(**functions)
