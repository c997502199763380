// RoPE (neox style, rotate_half) on a fused QKV projection's q and k, and the step's keys and
// values written into their cache slots: one launch for what torch runs as some twenty.
// The rotation rounds as torch's Rope.apply does: each product in float32, then the sum, then T;
// an fp8 cache (CACHE_T of common.cuh) then gets that roped key rounded once more, as the torch
// path's to_cache_dtype(rope(k)) does.
#include "common.cuh"

namespace pagedgen {

// grid (num_tokens), block min(512, (num_heads + num_kv_heads) * head_size / 2 rounded up to 32)
//
// A slot addresses the cache viewed as [num_blocks * block_size, num_kv_heads * head_size], as
// in reshape_and_cache. The roped keys are also written back into qkv, for attention paths that
// read this step's keys from the projection rather than from the cache.
template <typename T, typename CACHE_T>
__global__ void rope_and_cache_kernel(
    T* __restrict__ query,                       // [num_tokens, num_heads, head_size], written
    T* __restrict__ qkv,                         // [num_tokens, (num_heads + 2 * num_kv_heads) * head_size], rows qkv_stride apart
    CACHE_T* __restrict__ key_cache,             // [num_blocks, block_size, num_kv_heads, head_size]
    CACHE_T* __restrict__ value_cache,           // [num_blocks, block_size, num_kv_heads, head_size]
    const float* __restrict__ cos,               // [num_tokens, head_size / 2]: each token's row
    const float* __restrict__ sin,               // [num_tokens, head_size / 2]
    const long long* __restrict__ slot_mapping,  // [num_tokens]; -1 = write nothing
    int num_heads, int num_kv_heads, int head_size, int qkv_stride) {
  const long long token = blockIdx.x;
  const int half = head_size / 2, token_size = num_kv_heads * head_size;
  const long long slot = slot_mapping[token];
  T* row = qkv + token * qkv_stride;
  for (int pair = threadIdx.x; pair < (num_heads + num_kv_heads) * half; pair += blockDim.x) {
    const int head = pair / half, i = pair % half;
    const float c = cos[token * half + i], s = sin[token * half + i];
    T* x = row + head * head_size;
    const float x1 = to_float(x[i]), x2 = to_float(x[i + half]);
    const T y1 = from_float<T>(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
    const T y2 = from_float<T>(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
    if (head < num_heads) {
      T* q = query + (token * num_heads + head) * head_size;
      q[i] = y1;
      q[i + half] = y2;
    } else {
      x[i] = y1;
      x[i + half] = y2;
      if (slot >= 0) {
        CACHE_T* k = key_cache + slot * token_size + (head - num_heads) * head_size;
        k[i] = to_cache<CACHE_T>(y1);
        k[i + half] = to_cache<CACHE_T>(y2);
      }
    }
  }
  if (slot < 0) return;
  const T* value = row + (num_heads + num_kv_heads) * head_size;
  for (int i = threadIdx.x; i < token_size; i += blockDim.x) {
    value_cache[slot * token_size + i] = to_cache<CACHE_T>(value[i]);
  }
}

}  // namespace pagedgen

// The runtime compiles one (scalar, cache type) per module and says which with -D; offline builds
// get every supported combination.
#define PAGEDGEN_ROPE_AND_CACHE(T, C)                                                   \
  template __global__ void pagedgen::rope_and_cache_kernel<T, C>(                       \
      T*, T*, C*, C*, const float*, const float*, const long long*, int, int, int, int);
#define PAGEDGEN_ROPE_AND_CACHE_SCALAR(T)          \
  PAGEDGEN_ROPE_AND_CACHE(T, T)                    \
  PAGEDGEN_ROPE_AND_CACHE(T, pagedgen::fp8_e4m3)   \
  PAGEDGEN_ROPE_AND_CACHE(T, pagedgen::fp8_e5m2)

#if defined(PAGEDGEN_SCALAR_T)
PAGEDGEN_ROPE_AND_CACHE(PAGEDGEN_SCALAR_T, PAGEDGEN_CACHE_T)
#else
PAGEDGEN_ROPE_AND_CACHE_SCALAR(float)
PAGEDGEN_ROPE_AND_CACHE_SCALAR(__half)
PAGEDGEN_ROPE_AND_CACHE_SCALAR(__nv_bfloat16)
#endif
