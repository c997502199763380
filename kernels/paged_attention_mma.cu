// Decode attention on tensor cores (sm_80 and newer): one thread block per (kv head, tile of up
// to 16 of its query heads, sequence[, partition]) computes the tile's scores and outputs with
// mma.sync.m16n8k16 while cp.async streams the next chunks of K and V into shared memory, so that
// a few instructions move each KV byte and the copies keep HBM busy. Same cache layout and
// semantics as kernels/paged_attention.cu (window, soft cap, sinks, ALiBi) for 16-bit caches of
// the activations' dtype. v2 combines its partitions itself, in the last block of each (tile,
// sequence) to finish. Any group size: MHA's tile holds one head.
//
//   key_cache, value_cache: [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_SIZE] of T
//   query heads of kv head k: k * group ... k * group + group - 1, group = num_heads / num_kv_heads
//   grid.x = num_kv_heads * num_tiles, tile i of a group holds heads 16 i ... (at most 16)
//   dynamic shared memory: MmaLayout<HEAD_SIZE>::kSharedBytes (decode_attend_mma.cuh)
#include "common.cuh"
#include "decode_attend_mma.cuh"

namespace pagedgen {

struct MmaTile {
  int kv_head;
  int first_head;
  int num_q_heads;
};

// A per-head array's entries from the tile's first head on, or nullptr.
__device__ __forceinline__ const float* per_head(const float* values, int first_head) {
  return values == nullptr ? nullptr : values + first_head;
}

__device__ __forceinline__ MmaTile mma_tile(int num_heads, int num_kv_heads) {
  const int group = num_heads / num_kv_heads;
  const int num_tiles = (group + kTileHeads - 1) / kTileHeads;
  const int kv_head = blockIdx.x / num_tiles;
  const int tile = blockIdx.x % num_tiles;
  return {kv_head, kv_head * group + tile * kTileHeads, min(kTileHeads, group - tile * kTileHeads)};
}

// grid (num_kv_heads * num_tiles, num_seqs), block kMmaThreads. Blocks start roughly in order
// of their index, so a seq_order that puts the longest contexts first keeps one long sequence
// from finishing alone after the rest (longest-processing-time-first scheduling).
template <typename T, int HEAD_SIZE, int BLOCK_SIZE>
__global__ void __launch_bounds__(kMmaThreads, kMmaMinBlocks<HEAD_SIZE>)
    paged_attention_mma_v1_kernel(
        T* __restrict__ out,                   // [num_seqs, num_heads, HEAD_SIZE]
        const T* __restrict__ query,           // [num_seqs, num_heads, HEAD_SIZE], q_stride rows
        const T* __restrict__ key_cache,       // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD]
        const T* __restrict__ value_cache,     // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD]
        const int* __restrict__ block_tables,  // [num_seqs, max_num_blocks_per_seq]
        const int* __restrict__ context_lens,  // [num_seqs]
        int max_num_blocks_per_seq, int q_stride, int num_kv_heads, float scale, int num_heads,
        int window, float softcap, const float* __restrict__ sinks,
        const float* __restrict__ alibi_slopes,
        const int* __restrict__ seq_order) {  // [num_seqs], a permutation: blockIdx.y's sequence
                                              // (nullptr: blockIdx.y)
  const int seq = seq_order != nullptr ? seq_order[blockIdx.y] : blockIdx.y;
  const MmaTile tile = mma_tile(num_heads, num_kv_heads);
  const int context_len = context_lens[seq];
  const int window_start = window > 0 ? max(0, context_len - window) : 0;
  const MmaDecodeOptions options{window_start, softcap, per_head(alibi_slopes, tile.first_head),
                                 context_len - 1, per_head(sinks, tile.first_head)};
  attend_mma<T, HEAD_SIZE, BLOCK_SIZE>(
      out + ((long long)seq * num_heads + tile.first_head) * HEAD_SIZE, HEAD_SIZE, nullptr,
      nullptr, 0, query + (long long)seq * q_stride + tile.first_head * HEAD_SIZE,
      tile.num_q_heads, key_cache, value_cache,
      block_tables + (long long)seq * max_num_blocks_per_seq, tile.kv_head, num_kv_heads, scale,
      window_start / BLOCK_SIZE * BLOCK_SIZE, context_len, options);
}

// grid (num_kv_heads * num_tiles, num_seqs, max_num_partitions), block kMmaThreads. Each block
// writes its partition's partial outputs and stats (per query head, as
// paged_attention_v2_reduce_kernel lays them out), then counts itself in counters[seq][tile]; the
// block that completes the count combines every partition of its tile into out and resets the
// count to 0 for the next launch, so no reduce launch follows. counters must start at 0.
template <typename T, int HEAD_SIZE, int BLOCK_SIZE>
__global__ void __launch_bounds__(kMmaThreads, kMmaMinBlocks<HEAD_SIZE>)
    paged_attention_mma_v2_kernel(
        T* __restrict__ out,                   // [num_seqs, num_heads, HEAD_SIZE]
        float* __restrict__ exp_sums,          // [num_seqs, num_heads, max_num_partitions]
        float* __restrict__ max_logits,        // [num_seqs, num_heads, max_num_partitions]
        float* __restrict__ tmp_out,           // [num_seqs, num_heads, max_num_partitions, HEAD]
        int* __restrict__ counters,            // [num_seqs, num_kv_heads * num_tiles], zeros
        const T* __restrict__ query,           // [num_seqs, num_heads, HEAD_SIZE], q_stride rows
        const T* __restrict__ key_cache,       // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD]
        const T* __restrict__ value_cache,     // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD]
        const int* __restrict__ block_tables,  // [num_seqs, max_num_blocks_per_seq]
        const int* __restrict__ context_lens,  // [num_seqs]
        int max_num_blocks_per_seq, int q_stride, int num_kv_heads, float scale, int num_heads,
        int partition_size,  // a multiple of BLOCK_SIZE: partitions start on a block boundary
        int window, float softcap, const float* __restrict__ sinks,
        const float* __restrict__ alibi_slopes) {
  const int seq = blockIdx.y;
  const int partition = blockIdx.z;
  const int context_len = context_lens[seq];
  const int window_start = window > 0 ? max(0, context_len - window) : 0;
  const int start_token = partition * partition_size;
  const int end_token = min(start_token + partition_size, context_len);
  // Past the context or before the window: nothing to see, and not counted. The whole thread
  // block leaves together.
  if (start_token >= context_len || end_token <= window_start) return;
  const MmaTile tile = mma_tile(num_heads, num_kv_heads);
  const MmaDecodeOptions options{max(start_token, window_start), softcap,
                                 per_head(alibi_slopes, tile.first_head), context_len - 1,
                                 nullptr};  // the combine counts the sinks
  const long long first_row = ((long long)seq * num_heads + tile.first_head) * gridDim.z;
  const long long row = first_row + partition;
  attend_mma<T, HEAD_SIZE, BLOCK_SIZE>(
      tmp_out + row * HEAD_SIZE, (long long)gridDim.z * HEAD_SIZE, max_logits + row,
      exp_sums + row, gridDim.z, query + (long long)seq * q_stride + tile.first_head * HEAD_SIZE,
      tile.num_q_heads, key_cache, value_cache,
      block_tables + (long long)seq * max_num_blocks_per_seq, tile.kv_head, num_kv_heads, scale,
      start_token, end_token, options);

  // Publish the partials before the count; the last block reads them back through L2 (__ldcg),
  // after its own fence.
  __shared__ bool s_last;
  __threadfence();
  __syncthreads();
  const int num_partitions = (context_len + partition_size - 1) / partition_size;
  const int first_partition = window_start / partition_size;
  if (threadIdx.x == 0) {
    int* count = &counters[(long long)seq * gridDim.x + blockIdx.x];
    s_last = atomicAdd(count, 1) == num_partitions - first_partition - 1;
    if (s_last) *count = 0;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // Warp w combines heads w, w + kMmaWarps, ...: its lanes take the partitions in turn for the
  // head's max logit and exp sum, then dims lane * DIMS ... of the output over every partition.
  constexpr int DIMS = HEAD_SIZE / kWarpSize;
  constexpr int kCombineUnroll = 8;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  for (int g = warp; g < tile.num_q_heads; g += kMmaWarps) {
    const long long head_row = first_row + (long long)g * gridDim.z;
    const float sink = sinks != nullptr ? sinks[tile.first_head + g] : kNegMax;
    float max_logit = kNegMax;
    for (int p = first_partition + lane; p < num_partitions; p += kWarpSize) {
      max_logit = fmaxf(max_logit, __ldcg(&max_logits[head_row + p]));
    }
    max_logit = fmaxf(warp_max(max_logit), sink);
    float exp_sum = 0.f;
    for (int p = first_partition + lane; p < num_partitions; p += kWarpSize) {
      exp_sum += __ldcg(&exp_sums[head_row + p]) * __expf(__ldcg(&max_logits[head_row + p]) - max_logit);
    }
    // A sink is one more logit in the sum, of zero value (exp(kNegMax - max_logit) = 0 without).
    exp_sum = warp_sum(exp_sum) + __expf(sink - max_logit);
    // kCombineUnroll partitions' loads in flight at once (one long sequence has dozens of
    // partitions, each an L2 round trip); the sum keeps the partitions' order. A slot past the
    // last partition rereads it and weighs it 0.
    float acc[DIMS] = {};
    for (int p0 = first_partition; p0 < num_partitions; p0 += kCombineUnroll) {
      float weight[kCombineUnroll];
      float partial[kCombineUnroll][DIMS];
#pragma unroll
      for (int u = 0; u < kCombineUnroll; ++u) {
        const int p = min(p0 + u, num_partitions - 1);
        weight[u] = p0 + u < num_partitions
                        ? __ldcg(&exp_sums[head_row + p]) *
                              __expf(__ldcg(&max_logits[head_row + p]) - max_logit)
                        : 0.f;
        const float* row = &tmp_out[(head_row + p) * HEAD_SIZE + lane * DIMS];
#pragma unroll
        for (int e = 0; e < DIMS; ++e) partial[u][e] = __ldcg(&row[e]);
      }
#pragma unroll
      for (int u = 0; u < kCombineUnroll; ++u) {
#pragma unroll
        for (int e = 0; e < DIMS; ++e) acc[e] += partial[u][e] * weight[u];
      }
    }
    T* dst = out + ((long long)seq * num_heads + tile.first_head + g) * HEAD_SIZE + lane * DIMS;
#pragma unroll
    for (int e = 0; e < DIMS; ++e) dst[e] = from_float<T>(acc[e] / exp_sum);
  }
}

}  // namespace pagedgen

// Explicit instantiations, as pagedgen/kernels/paged_attention_mma.py names them. The runtime
// compiles one (scalar, head size, block size) per module and says which with -D; offline builds
// (nvcc -cubin in the tests) get every supported combination.
#define PAGEDGEN_PAM_BLOCK(T, HEAD, BLOCK)                                                      \
  template __global__ void pagedgen::paged_attention_mma_v1_kernel<T, HEAD, BLOCK>(            \
      T*, const T*, const T*, const T*, const int*, const int*, int, int, int, float, int, int, \
      float, const float*, const float*, const int*);                                           \
  template __global__ void pagedgen::paged_attention_mma_v2_kernel<T, HEAD, BLOCK>(            \
      T*, float*, float*, float*, int*, const T*, const T*, const T*, const int*, const int*,   \
      int, int, int, float, int, int, int, float, const float*, const float*);
#define PAGEDGEN_PAM_HEAD(T, HEAD)   \
  PAGEDGEN_PAM_BLOCK(T, HEAD, 8)     \
  PAGEDGEN_PAM_BLOCK(T, HEAD, 16)    \
  PAGEDGEN_PAM_BLOCK(T, HEAD, 32)
#define PAGEDGEN_PAM_SCALAR(T) \
  PAGEDGEN_PAM_HEAD(T, 64)     \
  PAGEDGEN_PAM_HEAD(T, 128)    \
  PAGEDGEN_PAM_HEAD(T, 256)

#if defined(PAGEDGEN_SCALAR_T)
PAGEDGEN_PAM_BLOCK(PAGEDGEN_SCALAR_T, PAGEDGEN_HEAD_SIZE, PAGEDGEN_BLOCK_SIZE)
#else
PAGEDGEN_PAM_SCALAR(__half)
PAGEDGEN_PAM_SCALAR(__nv_bfloat16)
#endif
