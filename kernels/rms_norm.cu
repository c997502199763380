// RMSNorm of each token's hidden vector, as Llama's reference computes it, optionally adding the
// sublayer output to the residual stream first (vLLM's fused_add_rms_norm): one launch for what
// torch runs as five or six.
#include "common.cuh"

namespace pagedgen {

// The sum of x over the block, returned to every thread. blockDim.x: a multiple of 32, <= 1024.
// Called once per kernel: the partials are not guarded for reuse.
__device__ __forceinline__ float block_sum(float x) {
  __shared__ float partials[kWarpSize];
  x = warp_sum(x);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  if (lane == 0) partials[warp] = x;
  __syncthreads();
  x = lane < static_cast<int>(blockDim.x / kWarpSize) ? partials[lane] : 0.f;
  return warp_sum(x);
}

// x * inv_rms scaled by the weight: in float32 for float (torch's rms_norm with its weight);
// for half types normalized in float32, rounded to T, then scaled in T (Llama's reference).
template <typename T>
__device__ __forceinline__ T scale_normed(float x, float inv_rms, T weight) {
  const T normed = from_float<T>(__fmul_rn(x, inv_rms));
  return from_float<T>(__fmul_rn(to_float(weight), to_float(normed)));
}

// grid (num_tokens), block min(1024, hidden / kVec rounded up to 32)
//
// kAddResidual: residual[t] += x[t] (rounded to T, as torch's add), then out[t] is the norm of
// the new residual; out may be x itself (each element is read and written by one thread). Each
// thread moves kVec elements at once: 16 bytes where hidden and x_stride are multiples of kVec
// and every tensor is 16-byte aligned (layer_ops.vector_width), else 1.
template <typename T, bool kAddResidual, int kVec>
__global__ void rms_norm_kernel(
    T* out,                        // [num_tokens, hidden]; may be x
    T* __restrict__ residual,      // [num_tokens, hidden]; unused without kAddResidual
    const T* x,                    // [num_tokens, hidden], rows x_stride apart
    const T* __restrict__ weight,  // [hidden]
    float eps, int hidden, int x_stride) {
  using V = Vec<T, kVec>;
  const long long token = blockIdx.x;
  const V* row = reinterpret_cast<const V*>(x + token * x_stride);
  V* residual_row = reinterpret_cast<V*>(residual + token * hidden);
  const int n = hidden / kVec;
  float sum = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    V v = row[i];
    if (kAddResidual) {
      const V r = residual_row[i];
#pragma unroll
      for (int j = 0; j < kVec; j++)
        v.data[j] = from_float<T>(to_float(v.data[j]) + to_float(r.data[j]));
      residual_row[i] = v;
    }
#pragma unroll
    for (int j = 0; j < kVec; j++) sum += to_float(v.data[j]) * to_float(v.data[j]);
  }
  const float inv_rms = rsqrtf(block_sum(sum) / hidden + eps);
  V* out_row = reinterpret_cast<V*>(out + token * hidden);
  const V* weights = reinterpret_cast<const V*>(weight);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const V v = kAddResidual ? residual_row[i] : row[i];
    const V w = weights[i];
    V o;
#pragma unroll
    for (int j = 0; j < kVec; j++)
      o.data[j] = scale_normed(to_float(v.data[j]), inv_rms, w.data[j]);
    out_row[i] = o;
  }
}

}  // namespace pagedgen

#define PAGEDGEN_RMS_NORM(T, V)                                                              \
  template __global__ void pagedgen::rms_norm_kernel<T, false, V>(T*, T*, const T*, const T*,  \
                                                                  float, int, int);            \
  template __global__ void pagedgen::rms_norm_kernel<T, true, V>(T*, T*, const T*, const T*,   \
                                                                 float, int, int);
PAGEDGEN_RMS_NORM(float, 1)
PAGEDGEN_RMS_NORM(float, 4)
PAGEDGEN_RMS_NORM(__half, 1)
PAGEDGEN_RMS_NORM(__half, 8)
PAGEDGEN_RMS_NORM(__nv_bfloat16, 1)
PAGEDGEN_RMS_NORM(__nv_bfloat16, 8)
