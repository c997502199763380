import functools
import re
import sys
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable
else:
    from importlib.abc import Traversable

_INCLUDE = re.compile(r'^#include "([\w.]+)"$', re.MULTILINE)


def kernel_dir() -> Traversable:
    """The installed pagedgen._kernels package, or kernels/ of a source checkout."""
    try:
        return resources.files("pagedgen._kernels")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "kernels"


def kernel_names() -> list[str]:
    return sorted(
        f.name for f in kernel_dir().iterdir() if f.name.endswith((".cu", ".cuh", ".c", ".h"))
    )


@functools.cache
def kernel_source(name: str) -> str:
    """The text of kernels/<name> with its local #include "x.cuh" lines inlined.

    Inlining keeps the source self-contained, so NVRTC needs no include path for our headers and
    CuPy's on-disk cache, keyed by source text, sees every header change.
    """
    path = kernel_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"no kernel source {name!r} in {kernel_dir()}")
    seen: set[str] = set()

    def inline(match: re.Match[str]) -> str:
        header = match.group(1)
        if header in seen:  # every header is #pragma once
            return ""
        seen.add(header)
        return _INCLUDE.sub(inline, _read(header))

    return _INCLUDE.sub(inline, _read(name))


def _read(name: str) -> str:
    return (kernel_dir() / name).read_text(encoding="utf-8")
