"""The CPU emulator itself (cuda_emu.h): barriers, shuffles and blocks behave as on a GPU, the
schedule is deterministic, and the launches a GPU would hang or misrun on fail with a message."""

import numpy as np
import pytest
import torch

from pagedgen.kernels.launch import KernelLaunch, KernelModule
from tests.kernels.emulator import EmulationError, Emulator, have_gxx

pytestmark = pytest.mark.skipif(not have_gxx(), reason="g++ not found: no CPU emulation")

SOURCE = r"""
namespace pagedgen {

// out[block * n + tid] = the block's sum of (tid + block), by shared memory and a tree.
__global__ void block_sum(int* out, int sync) {
  __shared__ int s[1024];
  const int tid = threadIdx.x, n = blockDim.x, block = blockIdx.x;
  s[tid] = tid + block;
  if (sync) __syncthreads();
  int total = 0;
  for (int i = 0; i < n; ++i) total += s[i];
  out[block * n + tid] = total;
}

// out[tid] = the warp's sum of tid, by xor shuffles.
__global__ void warp_sum(int* out, int mask) {
  int v = threadIdx.x;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync((unsigned)mask, v, offset);
  out[threadIdx.x] = v;
}

// Half a warp waits for its whole warp, the other half for the whole block: neither arrives.
__global__ void divergent_barrier(int* out, int unused) {
  if (threadIdx.x % 32 < 16) {
    __syncwarp();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void shuffle_after_lanes_exit(int* out, int unused) {
  if (threadIdx.x % 32 == 31) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

// Deep recursion on each thread's stack: locals survive the other threads' turns.
__device__ int depth_sum(int depth) {
  volatile int local[64];
  for (int i = 0; i < 64; ++i) local[i] = depth;
  if (depth == 0) return 0;
  if (depth % 50 == 0) __syncthreads();
  return local[depth % 64] + depth_sum(depth - 1);
}

__global__ void deep_stacks(int* out, int depth) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = depth_sum(depth);
}

}  // namespace pagedgen
"""
KERNELS = ("block_sum", "warp_sum", "divergent_barrier", "shuffle_after_lanes_exit", "deep_stacks")
MODULE = KernelModule("test.cu", (), tuple(f"pagedgen::{name}" for name in KERNELS))


@pytest.fixture(scope="module")
def emulator() -> Emulator:
    return Emulator(SOURCE, list(MODULE.name_expressions))


def launch(emulator: Emulator, kernel: str, num_blocks: int, num_threads: int, arg: int):
    out = torch.zeros(num_blocks * num_threads, dtype=torch.int32)
    launch = KernelLaunch(
        MODULE, f"pagedgen::{kernel}", (num_blocks, 1, 1), (num_threads, 1, 1), (out, np.int32(arg))
    )
    emulator.launch(launch)
    return out


@pytest.mark.parametrize("num_threads", [32, 128, 1024])
def test_block_barrier_and_blocks(emulator, num_threads):
    num_blocks = 3
    out = launch(emulator, "block_sum", num_blocks, num_threads, 1).view(num_blocks, num_threads)
    for block in range(num_blocks):
        expected = num_threads * (num_threads - 1) // 2 + block * num_threads
        assert (out[block] == expected).all()


def test_a_missing_barrier_reads_stale_shared_memory_the_same_way_every_time(emulator):
    """Thread t runs to its end before t + 1 starts: it sees only the writes of threads < t, and
    whatever the launch before left in shared memory (a static here) for the rest."""
    synced = launch(emulator, "block_sum", 2, 64, 1)
    unsynced = launch(emulator, "block_sum", 2, 64, 0)
    assert not torch.equal(unsynced, synced)
    assert torch.equal(synced, launch(emulator, "block_sum", 2, 64, 1))
    assert torch.equal(unsynced, launch(emulator, "block_sum", 2, 64, 0))


def test_warp_shuffles(emulator):
    out = launch(emulator, "warp_sum", 1, 96, -1)
    expected = torch.tensor([sum(range(w * 32, w * 32 + 32)) for w in range(3)]).repeat_interleave(
        32
    )
    assert torch.equal(out, expected.to(torch.int32))


@pytest.mark.parametrize(
    ("kernel", "arg", "message"),
    [
        ("divergent_barrier", 0, "deadlock"),
        ("warp_sum", 0xFFFF, "partial mask"),
        ("shuffle_after_lanes_exit", 0, "synchronises with exited lanes"),
    ],
)
def test_launches_a_gpu_would_misrun_fail_and_the_next_launch_works(emulator, kernel, arg, message):
    with pytest.raises(EmulationError, match=message):
        launch(emulator, kernel, 2, 64, arg)
    test_block_barrier_and_blocks(emulator, 64)


def test_each_thread_has_a_stack_of_its_own(emulator):
    depth = 200
    out = launch(emulator, "deep_stacks", 2, 128, depth)
    assert (out == depth * (depth + 1) // 2).all()
