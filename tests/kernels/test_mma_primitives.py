"""kernels/mma.cuh's primitives against PTX's own tables, written out here independently of the
emulator: ldmatrix's fragments (plain and transposed), mma.sync.m16n8k16's A/B/C layouts and
cp.async's commit groups and zero fill. Probe kernels record what each lane holds; each runs in
the emulator (cuda_emu.h) and, where there is one, on a GPU, where the hardware is the judge."""

from collections.abc import Callable

import numpy as np
import pytest
import torch

from pagedgen.kernels import loader
from pagedgen.kernels.launch import KernelLaunch, KernelModule
from pagedgen.kernels.source import kernel_source
from tests.kernels.emulator import Emulator, have_gxx

PROBES = r"""
namespace probe {
using pagedgen::Vec;
using Piece = Vec<unsigned, 4>;

// Lane l addresses row l of a 32 x 8 matrix of 16-bit elements (four 8 x 8 matrices, one above
// the other); out[4 l + j] = register j of lane l.
template <bool TRANS>
__global__ void ldmatrix_probe(const Piece* in, unsigned* out) {
  __shared__ Piece tile[32];
  const int lane = threadIdx.x;
  tile[lane] = in[lane];
  __syncthreads();
  unsigned r[4];
  if (TRANS) {
    pagedgen::ldmatrix_x4_trans(r, &tile[lane]);
  } else {
    pagedgen::ldmatrix_x4(r, &tile[lane]);
  }
  for (int j = 0; j < 4; ++j) out[4 * lane + j] = r[j];
}

// d = a b + c from each lane's fragments: a[4 l + i], b[2 l + i], c and d[4 l + i].
template <typename T>
__global__ void mma_probe(const unsigned* a, const unsigned* b, const float* c, float* d) {
  const int lane = threadIdx.x;
  const unsigned fa[4] = {a[4 * lane], a[4 * lane + 1], a[4 * lane + 2], a[4 * lane + 3]};
  float acc[4] = {c[4 * lane], c[4 * lane + 1], c[4 * lane + 2], c[4 * lane + 3]};
  pagedgen::mma_16816<T>(acc, fa, b[2 * lane], b[2 * lane + 1]);
  for (int i = 0; i < 4; ++i) d[4 * lane + i] = acc[i];
}

// Thread t copies pieces t and t + 32 of in (the second zero-filled where t is odd) in two
// groups; out[t] is its view of the first piece after waiting for one group to remain in flight,
// out[32 + t] of the second after waiting for none, and out[64 + t] of piece (t + 1) % 32 after a
// barrier.
__global__ void cp_async_probe(const Piece* in, Piece* out) {
  __shared__ Piece tile[64];
  const int t = threadIdx.x;
  tile[t] = Piece{{1u, 1u, 1u, 1u}};
  tile[32 + t] = Piece{{1u, 1u, 1u, 1u}};
  __syncthreads();
  pagedgen::cp_async_16(&tile[t], &in[t], true);
  pagedgen::cp_async_commit();
  pagedgen::cp_async_16(&tile[32 + t], &in[32 + t], t % 2 == 0);
  pagedgen::cp_async_commit();
  pagedgen::cp_async_wait<1>();
  out[t] = tile[t];
  pagedgen::cp_async_wait<0>();
  out[32 + t] = tile[32 + t];
  __syncthreads();
  out[64 + t] = tile[(t + 1) % 32];
}
}  // namespace probe
"""
NAMES = [
    "probe::ldmatrix_probe<false>",
    "probe::ldmatrix_probe<true>",
    "probe::mma_probe<__half>",
    "probe::mma_probe<__nv_bfloat16>",
    "probe::cp_async_probe",
]
DTYPES = {"__half": torch.float16, "__nv_bfloat16": torch.bfloat16}
Launch = Callable[[str, tuple, int], None]


def probe_source() -> str:
    return kernel_source("mma.cuh") + PROBES


def emulator_launch() -> Launch:
    emulator = Emulator(probe_source(), NAMES)
    module = KernelModule("probe", (), tuple(NAMES))

    def launch(name: str, args: tuple, threads: int) -> None:
        emulator.launch(KernelLaunch(module, name, (1, 1, 1), (threads, 1, 1), args))

    return launch


def gpu_launch() -> Launch:
    import cupy

    module = cupy.RawModule(code=probe_source(), options=("-std=c++17",), name_expressions=NAMES)

    def launch(name: str, args: tuple, threads: int) -> None:
        pointers = tuple(np.uint64(a.data_ptr()) for a in args)
        module.get_function(name)((1,), (threads,), pointers)
        torch.cuda.synchronize()

    return launch


LAUNCHERS = [
    pytest.param(
        ("cpu", emulator_launch),
        marks=pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation"),
        id="emulator",
    ),
    pytest.param(
        ("cuda", gpu_launch),
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(
                not (torch.cuda.is_available() and loader.cupy_available()),
                reason="needs a CUDA GPU and CuPy",
            ),
        ],
        id="gpu",
    ),
]


@pytest.fixture(scope="module", params=LAUNCHERS)
def target(request) -> tuple[str, Launch]:
    device, make_launch = request.param
    return device, make_launch()


def halves(register: int) -> tuple[int, int]:
    return register & 0xFFFF, register >> 16


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_fragments(target, trans: bool) -> None:
    device, launch = target
    elements = torch.arange(32 * 8, dtype=torch.int32).to(torch.int16)  # element i holds i
    out = torch.zeros(32 * 4, dtype=torch.int32, device=device)
    launch(NAMES[trans], (elements.to(device), out), 32)
    got = out.cpu().tolist()
    for lane in range(32):
        for j in range(4):
            # PTX: a lane holds row lane / 4, columns 2 (lane % 4) + {0, 1} of matrix j; with
            # .trans, rows 2 (lane % 4) + {0, 1} of column lane / 4.
            if trans:
                want = tuple((8 * j + 2 * (lane % 4) + i) * 8 + lane // 4 for i in (0, 1))
            else:
                want = tuple((8 * j + lane // 4) * 8 + 2 * (lane % 4) + i for i in (0, 1))
            assert halves(got[4 * lane + j] & 0xFFFFFFFF) == want, (lane, j)


def fragments(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple:
    """Each lane's registers of A (16 x 16), B (16 x 8) and C (16 x 8), by PTX's tables:
    lane = 4 group + quad; A's registers hold (row group + 8 (i % 2), columns 2 quad + 8 (i / 2)
    + {0, 1}); B's (rows 2 quad + 8 i + {0, 1}, column group); C's (row group + 8 (i / 2),
    column 2 quad + i % 2)."""
    a_bits = a.view(torch.int16).int() & 0xFFFF
    b_bits = b.view(torch.int16).int() & 0xFFFF
    fa, fb, fc = [], [], []
    for lane in range(32):
        group, quad = divmod(lane, 4)
        for i in range(4):
            row, col = group + 8 * (i % 2), 2 * quad + 8 * (i // 2)
            fa.append(int(a_bits[row, col]) | int(a_bits[row, col + 1]) << 16)
        for i in range(2):
            row = 2 * quad + 8 * i
            fb.append(int(b_bits[row, group]) | int(b_bits[row + 1, group]) << 16)
        for i in range(4):
            fc.append(float(c[group + 8 * (i // 2), 2 * quad + i % 2]))
    as_int32 = lambda values: torch.tensor(values, dtype=torch.int64).to(torch.int32)  # noqa: E731
    return as_int32(fa), as_int32(fb), torch.tensor(fc)


@pytest.mark.parametrize("c_type", DTYPES)
def test_mma_16816(target, c_type: str) -> None:
    device, launch = target
    g = torch.Generator().manual_seed(0)
    dtype = DTYPES[c_type]
    a = torch.randn(16, 16, generator=g).to(dtype)
    b = torch.randn(16, 8, generator=g).to(dtype)
    c = torch.randn(16, 8, generator=g)
    fa, fb, fc = fragments(a, b, c)
    d = torch.empty(32 * 4, device=device)
    launch(f"probe::mma_probe<{c_type}>", tuple(t.to(device) for t in (fa, fb, fc)) + (d,), 32)
    expected = a.float() @ b.float() + c
    got = torch.empty(16, 8)
    for lane in range(32):
        group, quad = divmod(lane, 4)
        for i in range(4):
            got[group + 8 * (i // 2), 2 * quad + i % 2] = d[4 * lane + i]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_cp_async_groups_and_zero_fill(target) -> None:
    device, launch = target
    pieces = torch.arange(1000, 1000 + 64 * 4, dtype=torch.int32).view(64, 4)
    out = torch.zeros(96, 4, dtype=torch.int32, device=device)
    launch("probe::cp_async_probe", (pieces.to(device), out), 32)
    out = out.cpu()
    torch.testing.assert_close(out[:32], pieces[:32])
    second = pieces[32:].clone()
    second[1::2] = 0
    torch.testing.assert_close(out[32:64], second)
    torch.testing.assert_close(out[64:], pieces[:32].roll(-1, 0))


def test_emulator_lands_copies_only_at_the_wait() -> None:
    """Without the wait, a lane reads what shared memory held before: the emulator makes the
    missing wait visible (a GPU may or may not have landed the copy)."""
    if not have_gxx():
        pytest.skip("g++ not found: no CPU emulation")
    source = probe_source().replace("pagedgen::cp_async_wait<1>();", "", 1)
    emulator = Emulator(source, ["probe::cp_async_probe"])
    pieces = torch.arange(64 * 4, dtype=torch.int32).view(64, 4)
    out = torch.zeros(96, 4, dtype=torch.int32)
    module = KernelModule("probe", (), ("probe::cp_async_probe",))
    emulator.launch(
        KernelLaunch(module, "probe::cp_async_probe", (1, 1, 1), (32, 1, 1), (pieces, out))
    )
    assert (out[:32] == 1).all()
