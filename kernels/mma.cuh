// Warp-level tensor-core and async-copy primitives (sm_80 and newer) for 16-bit operands:
// cp.async global -> shared copies in commit groups, ldmatrix fragment loads, and
// mma.sync.m16n8k16 with float accumulators. Layouts are PTX's ("Matrix Fragments for
// mma.m16n8k16"): lane = 4 * group + quad, and
//   A (16 x 16, row-major), 4 registers of 2 elements: a[0] row group, columns 2 * quad + {0, 1};
//     a[1] row group + 8; a[2] row group, columns + 8; a[3] row group + 8, columns + 8
//   B (16 x 8, "col"), 2 registers: b0 rows (k) 2 * quad + {0, 1}, column (n) group; b1 rows + 8
//   C, D (16 x 8 float): c[0..1] row group, columns 2 * quad + {0, 1}; c[2..3] row group + 8
// ldmatrix.x4 reads four 8 x 8 matrices of 16-bit elements whose rows (16 bytes each) lanes
// 8 * j ... 8 * j + 7 address; register j of a lane holds row lane / 4, columns 2 * (lane % 4)
// + {0, 1} of matrix j, or with .trans rows 2 * (lane % 4) + {0, 1} of column lane / 4.
//
// Under g++ (tests/kernels/cuda_emu.h) each is the emulator's function of the same semantics:
// copies land only when a wait retires their group, so a read before its wait sees stale data.
#pragma once

#include "common.cuh"

namespace pagedgen {

// Two values as one register of a 16-bit type T, lo in the low half (the lower column).
template <typename T>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  const Vec<T, 2> v = {{from_float<T>(lo), from_float<T>(hi)}};
  return *reinterpret_cast<const unsigned*>(&v);
}

#if defined(__CUDACC__)

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory, bypassing L1; zeros instead where !valid (src is then
// never read, but must still be a global address).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// d += a * b over one 16 x 8 x 16 tile, T __half or __nv_bfloat16.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
  if constexpr (IsSame<T, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(IsSame<T, __half>::value, "tensor cores take float16 or bfloat16 operands");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

#else  // the emulator's

__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  emu_cp_async(dst, src, 16, valid ? 16 : 0);
}
__device__ __forceinline__ void cp_async_commit() { emu_cp_async_commit(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  emu_cp_async_wait(N);
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* row) {
  emu_ldmatrix_x4(r, row, false);
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* row) {
  emu_ldmatrix_x4(r, row, true);
}
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
  emu_mma_16816<T>(d, a, b0, b1);
}

#endif

}  // namespace pagedgen
