// Copies whole KV blocks inside every layer's cache, for copy-on-write. T only sets the element
// size: fp8 caches are copied as bytes (unsigned char).
#include "common.cuh"

namespace pagedgen {

// grid (num_layers, num_pairs), block min(1024, numel_per_block)
//
// Pairs run concurrently, so no block may be both a source and a destination in one launch; the
// block manager's copy-on-write only ever copies a shared block into a fresh one.
template <typename T>
__global__ void copy_blocks_kernel(
    const long long* __restrict__ key_cache_ptrs,    // [num_layers], each T[num_blocks, numel_per_block]
    const long long* __restrict__ value_cache_ptrs,  // [num_layers], each T[num_blocks, numel_per_block]
    const long long* __restrict__ block_mapping,     // [num_pairs, 2]: (src, dst)
    int numel_per_block) {
  T* key_cache = reinterpret_cast<T*>(key_cache_ptrs[blockIdx.x]);
  T* value_cache = reinterpret_cast<T*>(value_cache_ptrs[blockIdx.x]);
  const long long src = block_mapping[2 * blockIdx.y] * numel_per_block;
  const long long dst = block_mapping[2 * blockIdx.y + 1] * numel_per_block;
  for (int i = threadIdx.x; i < numel_per_block; i += blockDim.x) {
    key_cache[dst + i] = key_cache[src + i];
    value_cache[dst + i] = value_cache[src + i];
  }
}

}  // namespace pagedgen

#define PAGEDGEN_COPY_BLOCKS(T)                                                         \
  template __global__ void pagedgen::copy_blocks_kernel<T>(const long long*, const long long*, \
                                                           const long long*, int);
PAGEDGEN_COPY_BLOCKS(float)
PAGEDGEN_COPY_BLOCKS(__half)
PAGEDGEN_COPY_BLOCKS(__nv_bfloat16)
PAGEDGEN_COPY_BLOCKS(unsigned char)
