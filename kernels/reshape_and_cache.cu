// Writes the new tokens' keys and values into their cache slots, rounded to the cache's type.
#include "common.cuh"

namespace pagedgen {

// grid (num_tokens), block min(512, token_size)
//
// A slot addresses the cache viewed as [num_blocks * block_size, num_kv_heads * head_size]:
//   slot = block_table[pos / block_size] * block_size + pos % block_size
// so token i's row starts at slot * token_size, whatever the block size. CACHE_T is T, or an fp8
// type of common.cuh that the values are rounded to as to_cache_dtype rounds them.
template <typename T, typename CACHE_T>
__global__ void reshape_and_cache_kernel(
    CACHE_T* __restrict__ key_cache,             // [num_blocks, block_size, num_kv_heads, head]
    CACHE_T* __restrict__ value_cache,           // [num_blocks, block_size, num_kv_heads, head]
    const T* __restrict__ key,                   // [num_tokens, num_kv_heads, head], strided
    const T* __restrict__ value,                 // [num_tokens, num_kv_heads, head], strided
    const long long* __restrict__ slot_mapping,  // [num_tokens]; -1 = write nothing
    int key_stride, int value_stride, int token_size) {
  const long long token = blockIdx.x;
  const long long slot = slot_mapping[token];
  if (slot < 0) return;
  for (int i = threadIdx.x; i < token_size; i += blockDim.x) {
    key_cache[slot * token_size + i] = to_cache<CACHE_T>(key[token * key_stride + i]);
    value_cache[slot * token_size + i] = to_cache<CACHE_T>(value[token * value_stride + i]);
  }
}

}  // namespace pagedgen

// The runtime compiles one (scalar, cache type) per module and says which with -D; offline builds
// get every supported combination.
#define PAGEDGEN_RESHAPE_AND_CACHE(T, C)                                  \
  template __global__ void pagedgen::reshape_and_cache_kernel<T, C>(      \
      C*, C*, const T*, const T*, const long long*, int, int, int);
#define PAGEDGEN_RESHAPE_AND_CACHE_SCALAR(T)               \
  PAGEDGEN_RESHAPE_AND_CACHE(T, T)                         \
  PAGEDGEN_RESHAPE_AND_CACHE(T, pagedgen::fp8_e4m3)        \
  PAGEDGEN_RESHAPE_AND_CACHE(T, pagedgen::fp8_e5m2)

#if defined(PAGEDGEN_SCALAR_T)
PAGEDGEN_RESHAPE_AND_CACHE(PAGEDGEN_SCALAR_T, PAGEDGEN_CACHE_T)
#else
PAGEDGEN_RESHAPE_AND_CACHE_SCALAR(float)
PAGEDGEN_RESHAPE_AND_CACHE_SCALAR(__half)
PAGEDGEN_RESHAPE_AND_CACHE_SCALAR(__nv_bfloat16)
#endif
