// Helpers shared by the kernels in this folder. Compiled three ways: by NVRTC at run time (CuPy),
// by nvcc in the compile tests, and by g++ against tests/kernels/cuda_emu.h, which then provides
// the CUDA builtins and the __half / __nv_bfloat16 types instead of the headers below.
#pragma once

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace pagedgen {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// NVRTC has no INFINITY. -FLT_MAX as "minus infinity" keeps exp(x - max) at 0 without inf - inf.
constexpr float kNegMax = -3.402823466e+38f;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// N elements of T moved by one 16-byte load.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T data[N];
};

__host__ __device__ constexpr int pow2_ceil(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int mask = kWarpSize / 2; mask > 0; mask /= 2) x += __shfl_xor_sync(kFullMask, x, mask);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int mask = kWarpSize / 2; mask > 0; mask /= 2) {
    x = fmaxf(x, __shfl_xor_sync(kFullMask, x, mask));
  }
  return x;
}

}  // namespace pagedgen
