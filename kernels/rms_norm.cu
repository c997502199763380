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

// grid (num_tokens), block min(1024, hidden rounded up to 32)
//
// kAddResidual: residual[t] += x[t] (rounded to T, as torch's add), then out[t] is the norm of
// the new residual; out may be x itself (each element is read and written by one thread).
template <typename T, bool kAddResidual>
__global__ void rms_norm_kernel(
    T* out,                        // [num_tokens, hidden]; may be x
    T* __restrict__ residual,      // [num_tokens, hidden]; unused without kAddResidual
    const T* x,                    // [num_tokens, hidden], rows x_stride apart
    const T* __restrict__ weight,  // [hidden]
    float eps, int hidden, int x_stride) {
  const long long token = blockIdx.x;
  const T* row = x + token * x_stride;
  T* residual_row = residual + token * hidden;
  float sum = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v = to_float(row[i]);
    if (kAddResidual) {
      const T added = from_float<T>(v + to_float(residual_row[i]));
      residual_row[i] = added;
      v = to_float(added);
    }
    sum += v * v;
  }
  const float inv_rms = rsqrtf(block_sum(sum) / hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float v = to_float(kAddResidual ? residual_row[i] : row[i]);
    out[token * hidden + i] = scale_normed(v, inv_rms, weight[i]);
  }
}

}  // namespace pagedgen

#define PAGEDGEN_RMS_NORM(T)                                                            \
  template __global__ void pagedgen::rms_norm_kernel<T, false>(T*, T*, const T*, const T*, \
                                                               float, int, int);         \
  template __global__ void pagedgen::rms_norm_kernel<T, true>(T*, T*, const T*, const T*,  \
                                                              float, int, int);
PAGEDGEN_RMS_NORM(float)
PAGEDGEN_RMS_NORM(__half)
PAGEDGEN_RMS_NORM(__nv_bfloat16)
