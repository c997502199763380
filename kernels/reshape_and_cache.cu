// Writes the new tokens' keys and values into their cache slots.
#include "common.cuh"

namespace pagedgen {

// grid (num_tokens), block min(512, token_size)
//
// A slot addresses the cache viewed as [num_blocks * block_size, num_kv_heads * head_size]:
//   slot = block_table[pos / block_size] * block_size + pos % block_size
// so token i's row starts at slot * token_size, whatever the block size.
template <typename T>
__global__ void reshape_and_cache_kernel(
    T* __restrict__ key_cache,                 // [num_blocks, block_size, num_kv_heads, head_size]
    T* __restrict__ value_cache,               // [num_blocks, block_size, num_kv_heads, head_size]
    const T* __restrict__ key,                 // [num_tokens, num_kv_heads, head_size], rows key_stride apart
    const T* __restrict__ value,               // [num_tokens, num_kv_heads, head_size], rows value_stride apart
    const long long* __restrict__ slot_mapping,  // [num_tokens]; -1 = write nothing
    int key_stride, int value_stride, int token_size) {
  const long long token = blockIdx.x;
  const long long slot = slot_mapping[token];
  if (slot < 0) return;
  for (int i = threadIdx.x; i < token_size; i += blockDim.x) {
    key_cache[slot * token_size + i] = key[token * key_stride + i];
    value_cache[slot * token_size + i] = value[token * value_stride + i];
  }
}

}  // namespace pagedgen

#define PAGEDGEN_RESHAPE_AND_CACHE(T)                                     \
  template __global__ void pagedgen::reshape_and_cache_kernel<T>(         \
      T*, T*, const T*, const T*, const long long*, int, int, int);
PAGEDGEN_RESHAPE_AND_CACHE(float)
PAGEDGEN_RESHAPE_AND_CACHE(__half)
PAGEDGEN_RESHAPE_AND_CACHE(__nv_bfloat16)
