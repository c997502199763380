"""The cupy backend's refusals and the packaging of the kernel sources; no GPU needed."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pagedgen
from pagedgen.attention import get_attention_backend
from pagedgen.attention.cupy_backend import CupyAttentionBackend
from pagedgen.kernels import loader
from pagedgen.kernels.source import kernel_names, kernel_source


def test_cupy_backend_refuses_cpu_device() -> None:
    with pytest.raises(RuntimeError, match="CUDA devices only"):
        get_attention_backend("cupy", torch.device("cpu"), 64, 16)


def test_cupy_backend_without_cupy_or_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "cupy_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"needs CuPy and a visible GPU.*pagedgen\[cuda\]"):
        CupyAttentionBackend(torch.device("cuda"), 64, 16)


def test_only_the_loader_imports_cupy() -> None:
    package = Path(pagedgen.__file__).parent
    importers = {
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if re.search(r"^\s*(import cupy|from cupy)", path.read_text(), re.MULTILINE)
    }
    assert importers <= {"kernels/loader.py"}


def test_backend_module_imports_without_cupy() -> None:
    code = "import sys, pagedgen.attention.cupy_backend; assert 'cupy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_kernel_sources_are_found_and_self_contained() -> None:
    names = kernel_names()
    expected = {"common.cuh", "paged_attention.cu", "reshape_and_cache.cu", "copy_blocks.cu"}
    expected.add("paged_attention_cpu.c")
    assert expected <= set(names)
    for name in names:
        if name.endswith(".cu"):
            source = kernel_source(name)
            assert '#include "' not in source, f"{name} still includes a local header"
            assert "constexpr float kNegMax" in source
