"""The decode kernels' compile-time knobs (DecodeTuning) for benchmarks/sweep_decode.py: the
default compiles exactly the engine's modules; every swept tuning compiles through NVRTC as the
runtime would; the extreme ones, and every swept one of the tensor-core kernel, attend as the
reference, on the CPU through cuda_emu.h."""

import pytest
import torch

from benchmarks.decode_tunings import SWEEP
from pagedgen.kernels import paged_attention_mma as mma
from pagedgen.kernels.decode_tuning import DEFAULT_TUNING, DecodeTuning
from pagedgen.kernels.launch import KernelLaunch, KernelModule
from pagedgen.kernels.paged_attention import paged_attention_module
from pagedgen.kernels.paged_attention_grouped import grouped_module
from pagedgen.kernels.source import kernel_source
from tests.kernels.emulator import Emulator, have_gxx
from tests.kernels.paged_cases import TOLERANCES, decode_launches, make_decode_case, reference
from tests.kernels.test_compile import ARCHS, nvrtc_compile_all, requires_nvrtc

# Far from the default each way: more threads and loads in flight on a smaller register budget,
# and fewer threads with fewer loads in flight.
EXTREMES = (
    DecodeTuning(256, min_blocks_per_sm=2, k_unroll=16, v_unroll=16),
    DecodeTuning(64, min_blocks_per_sm=8, k_unroll=1, v_unroll=2),
)


def test_the_default_tuning_compiles_the_engines_modules() -> None:
    assert DEFAULT_TUNING.defines == () and DEFAULT_TUNING.label == "128 threads"
    for module in (
        paged_attention_module(torch.bfloat16, 128, 16),
        grouped_module(torch.bfloat16, 128, 16, 4),
    ):
        assert not any("DECODE" in d or "UNROLL" in d for d in module.defines)
        assert all(", 128" in name for name in module.name_expressions)
    tuned = DecodeTuning(256, 2, 16, 1)
    assert tuned.defines == (
        "PAGEDGEN_DECODE_THREADS=256",
        "PAGEDGEN_DECODE_MIN_BLOCKS=2",
        "PAGEDGEN_K_UNROLL=16",
        "PAGEDGEN_V_UNROLL=1",
    )
    module = paged_attention_module(torch.bfloat16, 128, 16, tuning=tuned)
    v1, v2, reduce = module.name_expressions
    assert v1.endswith(", 256>") and v2.endswith(", 256, 512>") and reduce.endswith(", 128, 512>")
    assert tuned.mma_defines == ("PAGEDGEN_MMA_MIN_BLOCKS=2",)


def test_mma_tunings_size_shared_memory_and_occupancy() -> None:
    """The engine's mma module has no knob; stages set the shared memory the launch asks for,
    which kernels/decode_attend_mma.cuh's MmaLayout must agree with, and the planner's fill
    follows the register budget asked for."""
    assert not any("MMA" in d for d in mma.mma_module(torch.bfloat16, 128, 16).defines)
    assert mma.shared_bytes(128) == 100 * 1024 and mma.shared_bytes(64) == 50 * 1024
    two = DecodeTuning(mma_stages=2, min_blocks_per_sm=3)
    assert two.mma_defines == ("PAGEDGEN_MMA_STAGES=2", "PAGEDGEN_MMA_MIN_BLOCKS=3")
    assert "PAGEDGEN_MMA_STAGES=2" in mma.mma_module(torch.bfloat16, 128, 16, two).defines
    assert (
        mma.shared_bytes(128, two) == 68 * 1024
        and two.label == "128 threads, 3 blocks/SM, 2 stages"
    )
    assert mma.blocks_per_sm(128) == 2 and mma.blocks_per_sm(128, two) == 3
    # 12 sequences of 2,048 tokens, 8 kv heads: 96 x 4 partitions of 512 fill two blocks an SM
    # of 132 SMs (264), not three (396), which takes partitions of 256.
    assert mma.mma_partition_size(2048, 96, 128, 132) == 512
    assert mma.mma_partition_size(2048, 96, 128, 132, two) == 256


@requires_nvrtc
@pytest.mark.parametrize("arch", ARCHS)
def test_every_swept_tuning_compiles(arch: str) -> None:
    modules = [
        grouped_module(torch.bfloat16, 128, 16, 4, None, l2_prefetch, tuning)
        if kind == "grouped"
        else paged_attention_module(torch.bfloat16, 64, 16, l2_prefetch=l2_prefetch, tuning=tuning)
        for kind, tunings in SWEEP.items()
        if kind != "mma"
        for tuning in tunings
        for l2_prefetch in (False, True)
    ]
    modules += [
        mma.mma_module(torch.bfloat16, head_size, 16, tuning)
        for tuning in SWEEP["mma"]
        for head_size in (64, 128)
    ]
    for module, (cubin, lowered) in zip(modules, nvrtc_compile_all(modules, arch)):
        assert all(name.encode() in cubin for name in lowered.values()), module


@pytest.fixture(scope="module")
def emulated() -> dict[KernelModule, Emulator]:
    if not have_gxx():
        pytest.skip("g++ not found: the CPU emulation of the CUDA kernels is compiled with it")
    return {}


def launch_all(emulators: dict[KernelModule, Emulator], launches: list[KernelLaunch]) -> None:
    """Launches through one emulator per module."""
    for launch in launches:
        module = launch.module
        if module not in emulators:
            names = list(module.name_expressions)
            emulators[module] = Emulator(kernel_source(module.source), names, module.defines)
        emulators[module].launch(launch)


@pytest.mark.parametrize("tuning", EXTREMES, ids=lambda t: t.label)
@pytest.mark.parametrize("grouped", [False, True], ids=["per-head", "grouped"])
@pytest.mark.parametrize("version", [1, 2])
def test_extreme_tunings_attend_as_the_reference(
    emulated: dict[KernelModule, Emulator], tuning: DecodeTuning, grouped: bool, version: int
) -> None:
    case = make_decode_case(torch.float16, 8, 2, 128, 16, (1, 17, 100, 700), seed=3)
    out = torch.full_like(case.query, float("nan"))
    partition_size = 256 if version == 2 else None
    launches = decode_launches(case, out, version, partition_size, grouped=grouped, tuning=tuning)
    assert launches[0].block == (tuning.num_threads, 1, 1)
    assert all(d in launches[0].module.defines for d in tuning.defines)
    launch_all(emulated, launches)
    tolerance = TOLERANCES[case.query.dtype]
    torch.testing.assert_close(out.float(), reference(case).float(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("tuning", SWEEP["mma"], ids=lambda t: t.label)
@pytest.mark.parametrize("head_size", [64, 128])
def test_swept_mma_tunings_attend_as_the_reference(
    emulated: dict[KernelModule, Emulator], tuning: DecodeTuning, head_size: int
) -> None:
    """Stages of 2 and 4 wrap the pipeline at other chunks than the default's 3: contexts of 1
    to 6 chunks of 64 tokens, one pass and partitions of 64 and 256."""
    case = make_decode_case(torch.bfloat16, 8, 2, head_size, 16, (1, 63, 130, 257, 330), seed=5)
    tolerance = TOLERANCES[case.query.dtype]
    for version, partition_size in ((1, None), (2, 64), (2, 256)):
        out = torch.full_like(case.query, float("nan"))
        launches = decode_launches(
            case, out, version, partition_size, tuning=tuning, tensor_cores=True
        )
        assert launches[0].module.source == "paged_attention_mma.cu"
        assert launches[0].shared_mem == mma.shared_bytes(head_size, tuning)
        launch_all(emulated, launches)
        torch.testing.assert_close(
            out.float(), reference(case).float(), atol=tolerance, rtol=tolerance
        )
