// RoPE (neox style, rotate_half) on a fused QKV projection's q and k, and the step's keys and
// values written into their cache slots: one launch for what torch runs as some twenty.
// The rotation rounds as torch's Rope.apply does: each product in float32, then the sum, then T;
// an fp8 cache (CACHE_T of common.cuh) then gets that roped key rounded once more, as the torch
// path's to_cache_dtype(rope(k)) does.
#include "common.cuh"

namespace pagedgen {

// grid (num_tokens), block min(512, (num_heads + num_kv_heads) * head_size / 2 / kVec rounded up
// to 32)
//
// A slot addresses the cache viewed as [num_blocks * block_size, num_kv_heads * head_size], as
// in reshape_and_cache. The roped keys are also written back into qkv, for attention paths that
// read this step's keys from the projection rather than from the cache.
//
// Each thread ropes kVec pairs (x[i + j], x[i + j + head_size / 2]) at once and moves kVec values:
// 16 bytes of T where head_size / 2 and qkv_stride are multiples of kVec and every tensor is
// aligned for its vectors (layer_ops.vector_width), else one element.
template <typename T, typename CACHE_T, int kVec>
__global__ void rope_and_cache_kernel(
    T* __restrict__ query,                       // [num_tokens, num_heads, head_size], written
    T* __restrict__ qkv,                         // [num_tokens, (num_heads + 2 * num_kv_heads) * head_size], rows qkv_stride apart
    CACHE_T* __restrict__ key_cache,             // [num_blocks, block_size, num_kv_heads, head_size]
    CACHE_T* __restrict__ value_cache,           // [num_blocks, block_size, num_kv_heads, head_size]
    const float* __restrict__ cos,               // [num_tokens, head_size / 2]: each token's row
    const float* __restrict__ sin,               // [num_tokens, head_size / 2]
    const long long* __restrict__ slot_mapping,  // [num_tokens]; -1 = write nothing
    int num_heads, int num_kv_heads, int head_size, int qkv_stride) {
  using V = Vec<T, kVec>;
  using F = Vec<float, kVec>;
  using C = Vec<CACHE_T, kVec>;
  const long long token = blockIdx.x;
  const int half = head_size / 2, half_vecs = half / kVec, token_size = num_kv_heads * head_size;
  const long long slot = slot_mapping[token];
  T* row = qkv + token * qkv_stride;
  const F* cos_row = reinterpret_cast<const F*>(cos + token * half);
  const F* sin_row = reinterpret_cast<const F*>(sin + token * half);
  for (int pair = threadIdx.x; pair < (num_heads + num_kv_heads) * half_vecs; pair += blockDim.x) {
    const int head = pair / half_vecs, i = pair % half_vecs;
    const F c = cos_row[i], s = sin_row[i];
    V* x = reinterpret_cast<V*>(row + head * head_size);
    const V a = x[i], b = x[i + half_vecs];
    V y1, y2;
#pragma unroll
    for (int j = 0; j < kVec; j++) {
      const float x1 = to_float(a.data[j]), x2 = to_float(b.data[j]);
      y1.data[j] = from_float<T>(__fsub_rn(__fmul_rn(x1, c.data[j]), __fmul_rn(x2, s.data[j])));
      y2.data[j] = from_float<T>(__fadd_rn(__fmul_rn(x2, c.data[j]), __fmul_rn(x1, s.data[j])));
    }
    if (head < num_heads) {
      V* q = reinterpret_cast<V*>(query + (token * num_heads + head) * head_size);
      q[i] = y1;
      q[i + half_vecs] = y2;
    } else {
      x[i] = y1;
      x[i + half_vecs] = y2;
      if (slot >= 0) {
        C* k = reinterpret_cast<C*>(key_cache + slot * token_size + (head - num_heads) * head_size);
        C k1, k2;
#pragma unroll
        for (int j = 0; j < kVec; j++) {
          k1.data[j] = to_cache<CACHE_T>(y1.data[j]);
          k2.data[j] = to_cache<CACHE_T>(y2.data[j]);
        }
        k[i] = k1;
        k[i + half_vecs] = k2;
      }
    }
  }
  if (slot < 0) return;
  const V* value = reinterpret_cast<const V*>(row + (num_heads + num_kv_heads) * head_size);
  C* value_slot = reinterpret_cast<C*>(value_cache + slot * token_size);
  for (int i = threadIdx.x; i < token_size / kVec; i += blockDim.x) {
    const V v = value[i];
    C out;
#pragma unroll
    for (int j = 0; j < kVec; j++) out.data[j] = to_cache<CACHE_T>(v.data[j]);
    value_slot[i] = out;
  }
}

}  // namespace pagedgen

// The runtime compiles one (scalar, cache type) per module, both widths, and says which with -D;
// offline builds get every supported combination.
#define PAGEDGEN_ROPE_AND_CACHE_WIDTH(T, C, W)                                          \
  template __global__ void pagedgen::rope_and_cache_kernel<T, C, W>(                    \
      T*, T*, C*, C*, const float*, const float*, const long long*, int, int, int, int);
#define PAGEDGEN_ROPE_AND_CACHE(T, C)      \
  PAGEDGEN_ROPE_AND_CACHE_WIDTH(T, C, 1)   \
  PAGEDGEN_ROPE_AND_CACHE_WIDTH(T, C, 16 / sizeof(T))
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
