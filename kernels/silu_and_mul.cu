// silu(gate) * up over rows [gate | up], as torch computes F.silu(gate) * up: silu in float32,
// rounded to T, then the product rounded to T. One launch for torch's two.
#include "common.cuh"

namespace pagedgen {

// grid (num_tokens), block min(1024, d rounded up to 32)
template <typename T>
__global__ void silu_and_mul_kernel(
    T* __restrict__ out,            // [num_tokens, d]
    const T* __restrict__ gate_up,  // [num_tokens, 2 * d]
    int d) {
  const long long token = blockIdx.x;
  const T* gate = gate_up + token * 2 * d;
  const T* up = gate + d;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float g = to_float(gate[i]);
    const T silu = from_float<T>(g / (1.f + expf(-g)));
    out[token * d + i] = from_float<T>(__fmul_rn(to_float(silu), to_float(up[i])));
  }
}

}  // namespace pagedgen

#define PAGEDGEN_SILU_AND_MUL(T) \
  template __global__ void pagedgen::silu_and_mul_kernel<T>(T*, const T*, int);
PAGEDGEN_SILU_AND_MUL(float)
PAGEDGEN_SILU_AND_MUL(__half)
PAGEDGEN_SILU_AND_MUL(__nv_bfloat16)
