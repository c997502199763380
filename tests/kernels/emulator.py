"""Runs the kernels' launch plans on the CPU: g++ compiles a kernels/ source against cuda_emu.h
into a shared library with one entry point per name expression, and ctypes launches it with the
same grid, block and arguments that pagedgen.kernels.loader would hand to CuPy."""

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np
import torch

from pagedgen.kernels.launch import KernelLaunch, KernelModule
from pagedgen.kernels.source import kernel_source

HERE = Path(__file__).resolve().parent
EMU_HEADER = HERE / "cuda_emu.h"
EMU_HEADERS = (EMU_HEADER, HERE / "cuda_emu_sm80.h")  # what cuda_emu.h includes, for the cache key
CXX_FLAGS = ("-std=c++17", "-O1", "-shared", "-fPIC", "-w")
_C_TYPES = {
    np.int32: ctypes.c_int32,
    np.int64: ctypes.c_int64,
    np.uint64: ctypes.c_uint64,  # a null pointer
    np.float32: ctypes.c_float,
}


def have_gxx() -> bool:
    return shutil.which("g++") is not None


@functools.cache
def _gxx_version() -> str:
    return subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout


def build_cache_dir() -> Path:
    """Where builds are kept by content (PAGEDGEN_EMU_CACHE): each happens once per machine."""
    path = Path(os.environ.get("PAGEDGEN_EMU_CACHE", Path(tempfile.gettempdir()) / "pagedgen-emu"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_path(prefix: str, suffix: str, *inputs: str) -> Path:
    """A build's place in build_cache_dir(), named by the content of everything it is built from:
    each build happens once per machine."""
    key = hashlib.sha256("\0".join(inputs).encode()).hexdigest()[:24]
    return build_cache_dir() / f"{prefix}{key}{suffix}"


def store(path: Path, data: bytes) -> None:
    """Writes a cached build whole or not at all: builds run in parallel."""
    partial = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.partial")
    partial.write_bytes(data)
    partial.replace(path)


def build_library(source: str, name_expressions: list[str], defines: tuple[str, ...] = ()) -> Path:
    """Compiles source (a kernels/ file's text, includes inlined) with an entry point launch_<i>
    for name_expressions[i]; cached by content, so each build happens once per machine.

    defines are -D macros, e.g. a KernelModule's, which narrow the explicit instantiations that
    g++ compiles besides those the entry points ask for."""
    entry_points = "\n".join(
        f'extern "C" const char* launch_{i}(unsigned gx, unsigned gy, unsigned gz, unsigned bx,\n'
        f"                                  void** args, size_t shared_bytes) {{\n"
        f"  static std::string error;\n"
        f"  error = emu::launch(&{expression}, dim3(gx, gy, gz), dim3(bx), args, shared_bytes);\n"
        f"  return error.c_str();\n"
        f"}}"
        for i, expression in enumerate(name_expressions)
    )
    header = "".join(path.read_text() for path in EMU_HEADERS)
    flags = [*CXX_FLAGS, *(f"-D{define}" for define in defines)]
    library = cache_path("", ".so", header, source, entry_points, " ".join(flags), _gxx_version())
    if library.exists():
        return library
    work = Path(tempfile.mkdtemp(dir=build_cache_dir()))
    (work / "kernel.cu").write_text(source)
    (work / "driver.cpp").write_text(
        f'#include "{EMU_HEADER}"\n#include "kernel.cu"\n\n{entry_points}\n'
    )
    result = subprocess.run(
        ["g++", *flags, "-o", str(work / "lib.so"), str(work / "driver.cpp")],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"g++ failed to build the emulated kernels:\n{result.stderr[-4000:]}")
    os.replace(work / "lib.so", library)
    shutil.rmtree(work, ignore_errors=True)
    return library


class EmulationError(RuntimeError):
    """The emulator refused the launch: a deadlock, a partial-mask shuffle, a bad block shape."""


class Emulator:
    """The kernels of one source, compiled for the CPU; runs KernelLaunch plans on CPU tensors."""

    def __init__(
        self, source: str, name_expressions: list[str], defines: tuple[str, ...] = ()
    ) -> None:
        self.name_expressions = list(name_expressions)
        self.library = ctypes.CDLL(str(build_library(source, self.name_expressions, defines)))

    def set_racing(self, racing: bool) -> None:
        """The schedule from now on (cuda_emu.h): warps in step with cp.async copies landing at
        their wait (the default), which shows reads before a wait or barrier; or racing, warp 0
        ahead of the others and copies landing at issue, which shows writes over shared memory
        that a later warp has yet to read."""
        self.library.emu_set_racing(int(racing))

    def launch(self, kernel_launch: KernelLaunch) -> None:
        index = self.name_expressions.index(kernel_launch.name_expression)
        entry = getattr(self.library, f"launch_{index}")
        entry.restype = ctypes.c_char_p
        values = [self._c_value(arg) for arg in kernel_launch.args]
        args = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        gx, gy, gz = kernel_launch.grid
        bx, by, bz = kernel_launch.block
        assert by == bz == 1, kernel_launch.block
        entry.argtypes = [*[ctypes.c_uint] * 4, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        error = entry(gx, gy, gz, bx, args, kernel_launch.shared_mem).decode()
        if error:
            raise EmulationError(f"{kernel_launch.name_expression}: {error}")

    def take_prefetched(self) -> list[int]:
        """The addresses that L2 prefetches asked for since the last call, in issue order."""
        library = self.library
        library.emu_num_prefetched.restype = ctypes.c_size_t
        library.emu_prefetched.restype = ctypes.c_uint64
        library.emu_prefetched.argtypes = [ctypes.c_size_t]
        addresses = [library.emu_prefetched(i) for i in range(library.emu_num_prefetched())]
        library.emu_clear_prefetched()
        return addresses

    @staticmethod
    def _c_value(arg: object) -> ctypes._SimpleCData:
        if isinstance(arg, torch.Tensor):
            assert arg.device.type == "cpu", arg.device
            return ctypes.c_void_p(arg.data_ptr())
        return _C_TYPES[type(arg)](arg.item())


@functools.cache
def module_emulator(module: KernelModule) -> Emulator:
    """The module as the runtime compiles it (its -D macros pick the instantiations), on the CPU."""
    return Emulator(kernel_source(module.source), list(module.name_expressions), module.defines)


def emulate(kernel_launch: KernelLaunch) -> None:
    """Runs a launch on the CPU, building (once, cached on disk) the module it names, as the
    runtime compiles one module per instantiation."""
    module_emulator(kernel_launch.module).launch(kernel_launch)
