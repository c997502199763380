// silu(gate) * up over rows [gate | up], as torch computes F.silu(gate) * up: silu in float32,
// rounded to T, then the product rounded to T. One launch for torch's two.
#include "common.cuh"

namespace pagedgen {

template <typename T>
__device__ __forceinline__ T silu_mul(T gate, T up) {
  const float g = to_float(gate);
  const T silu = from_float<T>(g / (1.f + expf(-g)));
  return from_float<T>(__fmul_rn(to_float(silu), to_float(up)));
}

// grid (num_tokens), block min(1024, d / kVec rounded up to 32)
//
// Each thread moves kVec elements at once: 16 bytes where d is a multiple of kVec and both
// tensors are 16-byte aligned (layer_ops.vector_width), else 1.
template <typename T, int kVec>
__global__ void silu_and_mul_kernel(
    T* __restrict__ out,            // [num_tokens, d]
    const T* __restrict__ gate_up,  // [num_tokens, 2 * d]
    int d) {
  using V = Vec<T, kVec>;
  const long long token = blockIdx.x;
  const V* gate = reinterpret_cast<const V*>(gate_up + token * 2 * d);
  const V* up = reinterpret_cast<const V*>(gate_up + token * 2 * d + d);
  V* row = reinterpret_cast<V*>(out + token * d);
  for (int i = threadIdx.x; i < d / kVec; i += blockDim.x) {
    const V g = gate[i], u = up[i];
    V r;
#pragma unroll
    for (int j = 0; j < kVec; j++) r.data[j] = silu_mul(g.data[j], u.data[j]);
    row[i] = r;
  }
}

}  // namespace pagedgen

#define PAGEDGEN_SILU_AND_MUL(T, V) \
  template __global__ void pagedgen::silu_and_mul_kernel<T, V>(T*, const T*, int);
PAGEDGEN_SILU_AND_MUL(float, 1)
PAGEDGEN_SILU_AND_MUL(float, 4)
PAGEDGEN_SILU_AND_MUL(__half, 1)
PAGEDGEN_SILU_AND_MUL(__half, 8)
PAGEDGEN_SILU_AND_MUL(__nv_bfloat16, 1)
PAGEDGEN_SILU_AND_MUL(__nv_bfloat16, 8)
