// Decode attention for GQA: one thread block per (kv head, sequence[, partition]) computes a
// tile of up to GROUP_TILE query heads of that kv head's group, so every K and V vector crosses
// from global memory once per block and serves each head of the tile. Same cache layout and
// semantics as kernels/paged_attention.cu, whose v2 reduce kernel combines our partitions (its
// rows are per query head, as ours are).
//
//   key_cache, value_cache: [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_SIZE] of CACHE_T
//   query heads of kv head k: k * group ... k * group + group - 1, group = num_heads / num_kv_heads
//   grid.x = num_kv_heads * num_tiles, tile i of a group holds heads i * GROUP_TILE ... (at most
//   GROUP_TILE; the missing heads of the last tile get zero queries and are not written)
#include "common.cuh"
#include "decode_tuning.cuh"
#include "decode_attend_group.cuh"

namespace pagedgen {

// 128 registers per thread, as in paged_attention.cu: 4 blocks of 128 threads per SM.
constexpr int kGroupedMinBlocksPerSm = PAGEDGEN_DECODE_MIN_BLOCKS;

// The tile of query heads that blockIdx.x stands for: kv_head, first query head and count.
struct GroupTile {
  int kv_head;
  int first_head;
  int num_q_heads;
};

template <int GROUP_TILE>
__device__ __forceinline__ GroupTile group_tile(int num_heads, int num_kv_heads) {
  const int group = num_heads / num_kv_heads;
  const int num_tiles = (group + GROUP_TILE - 1) / GROUP_TILE;
  const int kv_head = blockIdx.x / num_tiles;
  const int tile = blockIdx.x % num_tiles;
  const int first_head = kv_head * group + tile * GROUP_TILE;
  return {kv_head, first_head, min(GROUP_TILE, group - tile * GROUP_TILE)};
}

// grid (num_kv_heads * num_tiles, num_seqs), block NUM_THREADS
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          int GROUP_TILE>
__global__ void __launch_bounds__(NUM_THREADS, kGroupedMinBlocksPerSm)
    paged_attention_grouped_v1_kernel(
        T* __restrict__ out,                      // [num_seqs, num_heads, HEAD_SIZE]
        const T* __restrict__ query,              // [num_seqs, num_heads, HEAD_SIZE], q_stride rows
        const CACHE_T* __restrict__ key_cache,    // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD]
        const CACHE_T* __restrict__ value_cache,  // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD]
        const int* __restrict__ block_tables,     // [num_seqs, max_num_blocks_per_seq]
        const int* __restrict__ context_lens,     // [num_seqs]
        int max_num_blocks_per_seq, int q_stride, int num_kv_heads, float scale, int num_heads) {
  const int seq = blockIdx.y;
  const GroupTile tile = group_tile<GROUP_TILE>(num_heads, num_kv_heads);
  attend_group<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, GROUP_TILE>(
      out + ((long long)seq * num_heads + tile.first_head) * HEAD_SIZE, HEAD_SIZE, nullptr,
      nullptr, 0, query + (long long)seq * q_stride + tile.first_head * HEAD_SIZE,
      tile.num_q_heads, key_cache, value_cache,
      block_tables + (long long)seq * max_num_blocks_per_seq, tile.kv_head, num_kv_heads, scale,
      0, context_lens[seq]);
}

// grid (num_kv_heads * num_tiles, num_seqs, max_num_partitions), block NUM_THREADS; the stats
// and partial outputs are laid out per query head, as paged_attention_v2_reduce_kernel reads them.
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          int GROUP_TILE>
__global__ void __launch_bounds__(NUM_THREADS, kGroupedMinBlocksPerSm)
    paged_attention_grouped_v2_kernel(
        float* __restrict__ exp_sums,             // [num_seqs, num_heads, max_num_partitions]
        float* __restrict__ max_logits,           // [num_seqs, num_heads, max_num_partitions]
        float* __restrict__ tmp_out,              // [num_seqs, num_heads, max_num_partitions, HEAD]
        const T* __restrict__ query,              // [num_seqs, num_heads, HEAD_SIZE], q_stride rows
        const CACHE_T* __restrict__ key_cache,    // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD]
        const CACHE_T* __restrict__ value_cache,  // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD]
        const int* __restrict__ block_tables,     // [num_seqs, max_num_blocks_per_seq]
        const int* __restrict__ context_lens,     // [num_seqs]
        int max_num_blocks_per_seq, int q_stride, int num_kv_heads, float scale, int num_heads,
        int partition_size) {  // a multiple of BLOCK_SIZE: partitions start on a block boundary
  const int seq = blockIdx.y;
  const int partition = blockIdx.z;
  const int context_len = context_lens[seq];
  const int start_token = partition * partition_size;
  if (start_token >= context_len) return;  // the whole thread block leaves together
  const int end_token = min(start_token + partition_size, context_len);
  const GroupTile tile = group_tile<GROUP_TILE>(num_heads, num_kv_heads);
  const long long row = ((long long)seq * num_heads + tile.first_head) * gridDim.z + partition;
  attend_group<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS, GROUP_TILE>(
      tmp_out + row * HEAD_SIZE, (long long)gridDim.z * HEAD_SIZE, max_logits + row,
      exp_sums + row, gridDim.z, query + (long long)seq * q_stride + tile.first_head * HEAD_SIZE,
      tile.num_q_heads, key_cache, value_cache,
      block_tables + (long long)seq * max_num_blocks_per_seq, tile.kv_head, num_kv_heads, scale,
      start_token, end_token);
}

}  // namespace pagedgen

// Explicit instantiations, with the launch constants of pagedgen/kernels/paged_attention_grouped.py
// (group tiles 4 and 8, head size 256 only 4). The runtime compiles one (scalar, cache type, head
// size, block size, group tile) per module and says which with -D; offline builds (nvcc -cubin in
// the tests) get every supported combination.
#define PAGEDGEN_PAG_TILE(T, C, HEAD, BLOCK, TILE)                                                \
  template __global__ void                                                                       \
  pagedgen::paged_attention_grouped_v1_kernel<T, C, HEAD, BLOCK, PAGEDGEN_DECODE_THREADS, TILE>( \
      T*, const T*, const C*, const C*, const int*, const int*, int, int, int, float, int);     \
  template __global__ void                                                                       \
  pagedgen::paged_attention_grouped_v2_kernel<T, C, HEAD, BLOCK, PAGEDGEN_DECODE_THREADS, TILE>( \
      float*, float*, float*, const T*, const C*, const C*, const int*, const int*, int, int,   \
      int, float, int, int);
#define PAGEDGEN_PAG_HEAD(T, C, HEAD, TILE) \
  PAGEDGEN_PAG_TILE(T, C, HEAD, 8, TILE)    \
  PAGEDGEN_PAG_TILE(T, C, HEAD, 16, TILE)   \
  PAGEDGEN_PAG_TILE(T, C, HEAD, 32, TILE)
#define PAGEDGEN_PAG_CACHE(T, C)  \
  PAGEDGEN_PAG_HEAD(T, C, 64, 4)  \
  PAGEDGEN_PAG_HEAD(T, C, 64, 8)  \
  PAGEDGEN_PAG_HEAD(T, C, 80, 4)  \
  PAGEDGEN_PAG_HEAD(T, C, 80, 8)  \
  PAGEDGEN_PAG_HEAD(T, C, 96, 4)  \
  PAGEDGEN_PAG_HEAD(T, C, 96, 8)  \
  PAGEDGEN_PAG_HEAD(T, C, 128, 4) \
  PAGEDGEN_PAG_HEAD(T, C, 128, 8) \
  PAGEDGEN_PAG_HEAD(T, C, 256, 4)
#define PAGEDGEN_PAG_SCALAR(T)                \
  PAGEDGEN_PAG_CACHE(T, T)                    \
  PAGEDGEN_PAG_CACHE(T, pagedgen::fp8_e4m3)   \
  PAGEDGEN_PAG_CACHE(T, pagedgen::fp8_e5m2)

#if defined(PAGEDGEN_SCALAR_T)
PAGEDGEN_PAG_TILE(PAGEDGEN_SCALAR_T, PAGEDGEN_CACHE_T, PAGEDGEN_HEAD_SIZE, PAGEDGEN_BLOCK_SIZE,
                  PAGEDGEN_GROUP_TILE)
#else
PAGEDGEN_PAG_SCALAR(float)
PAGEDGEN_PAG_SCALAR(__half)
PAGEDGEN_PAG_SCALAR(__nv_bfloat16)
#endif
