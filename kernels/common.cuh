// Helpers shared by the kernels in this folder. Compiled three ways: by NVRTC at run time (CuPy),
// by nvcc in the compile tests, and by g++ against tests/kernels/cuda_emu.h, which then provides
// the CUDA builtins and the __half / __nv_bfloat16 types instead of the headers below.
#pragma once

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

// The launch's dynamic shared memory as `unsigned char* name`, 16-byte aligned, for a kernel that
// uses `bytes` of it (more than the 48 KB a block may have of static shared memory): the launch
// must give at least that much, which the emulator checks.
#if defined(__CUDACC__)
#define PAGEDGEN_DYNAMIC_SHARED(name, bytes)  \
  extern __shared__ float4 name##_storage[]; \
  unsigned char* name = reinterpret_cast<unsigned char*>(name##_storage)
#else
#define PAGEDGEN_DYNAMIC_SHARED(name, bytes) unsigned char* name = emu_dynamic_shared(bytes)
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

// 8-bit float KV caches (vLLM's kv_cache_dtype fp8, fp8_e4m3, fp8_e5m2), with our own types and
// conversions rather than cuda_fp8.h's, so that NVRTC, nvcc and the g++ emulator compile the
// same code. Values are unscaled, as pagedgen/attention/kv_cache_dtype.py's to_cache_dtype stores
// them: a write saturates to the finite range, then rounds to nearest even (NaN stays NaN); a
// read widens exactly.
struct fp8_e4m3 {  // OCP E4M3, torch.float8_e4m3fn: bias 7, no inf, S.1111.111 is NaN
  unsigned char bits;
};
struct fp8_e5m2 {  // torch.float8_e5m2: bias 15, S.11111.00 is inf, S.11111.xx NaN
  unsigned char bits;
};

// Every fp8 value is a float16: E5M2 is float16's top byte, and E4M3 moved into float16's
// fields is its value times 2^(7 - 15) (subnormals included); only E4M3's NaN lands on a number.
__device__ __forceinline__ float to_float(fp8_e5m2 x) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(x.bits << 8)));
}
__device__ __forceinline__ float to_float(fp8_e4m3 x) {
  const unsigned magnitude = x.bits & 0x7fu;
  const unsigned half_bits = (x.bits & 0x80u) << 8 | magnitude << 7;
  const float value = __half2float(__ushort_as_half(static_cast<unsigned short>(half_bits)));
  return magnitude == 0x7fu ? __uint_as_float(0x7fc00000u) : value * 256.f;
}

// What a write needs of each format: its exponent bias, mantissa width and largest finite code.
template <typename F>
struct Fp8Format;
template <>
struct Fp8Format<fp8_e4m3> {
  static constexpr int kBias = 7, kManBits = 3;
  static constexpr unsigned kMaxCode = 0x7e;  // 448
};
template <>
struct Fp8Format<fp8_e5m2> {
  static constexpr int kBias = 15, kManBits = 2;
  static constexpr unsigned kMaxCode = 0x7b;  // 57344
};

template <typename F>
__device__ __forceinline__ F float_to_fp8(float x) {
  using Format = Fp8Format<F>;
  constexpr int kDropped = 23 - Format::kManBits;
  constexpr unsigned kRebias = unsigned(127 - Format::kBias) << 23;
  constexpr unsigned kMax = (Format::kMaxCode << kDropped) + kRebias;
  constexpr unsigned kMinNormal = unsigned(127 + 1 - Format::kBias) << 23;
  // 2^(kBias + kManBits - 1): the number of subnormal steps in a float of magnitude 1
  constexpr unsigned kSubnormalSteps = unsigned(127 - 1 + Format::kBias + Format::kManBits) << 23;
  const unsigned u = __float_as_uint(x);
  const unsigned a = u & 0x7fffffffu;
  unsigned magnitude;
  if (a > 0x7f800000u) {
    magnitude = 0x7fu;  // NaN in both formats
  } else if (a >= kMax) {
    magnitude = Format::kMaxCode;  // saturated, as to_cache_dtype clamps first (inf included)
  } else if (a < kMinNormal) {
    // Subnormal steps, rounded to nearest even; 2^kManBits steps is the smallest normal's code.
    // (Under NVRTC's -ftz a float32 subnormal flushes to 0 here: it rounds to code 0 anyway.)
    magnitude = static_cast<unsigned>(rintf(__uint_as_float(a) * __uint_as_float(kSubnormalSteps)));
  } else {
    // Round to nearest even on the float's own bits: a carry out of the mantissa bumps the
    // exponent, which makes the next code up; below kMax that stops at kMaxCode.
    const unsigned rounded = a + (1u << (kDropped - 1)) - 1u + ((a >> kDropped) & 1u);
    magnitude = (rounded - kRebias) >> kDropped;
  }
  return {static_cast<unsigned char>((u >> 24 & 0x80u) | magnitude)};
}

template <>
__device__ __forceinline__ fp8_e4m3 from_float<fp8_e4m3>(float x) {
  return float_to_fp8<fp8_e4m3>(x);
}
template <>
__device__ __forceinline__ fp8_e5m2 from_float<fp8_e5m2>(float x) {
  return float_to_fp8<fp8_e5m2>(x);
}

template <typename A, typename B>
struct IsSame {
  static constexpr bool value = false;
};
template <typename A>
struct IsSame<A, A> {
  static constexpr bool value = true;
};

// x as a cache of element type C stores it: unchanged where C is T, else rounded to C. A float16
// NaN keeps its sign, as in torch's cast: the GPU's widening makes every NaN positive.
template <typename C, typename T>
__device__ __forceinline__ C to_cache(T x) {
  if constexpr (IsSame<C, T>::value) {
    return x;
  } else if constexpr (IsSame<T, __half>::value) {
    const float f = to_float(x);
    const unsigned sign = static_cast<unsigned>(__half_as_ushort(x) >> 15) << 31;
    return from_float<C>(f != f ? __uint_as_float(0x7fc00000u | sign) : f);
  } else {
    return from_float<C>(to_float(x));
  }
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
