// Decode attention over the paged KV cache: one query row per sequence.
//
// Cache layout, shared with the PyTorch backend so both read the same pool:
//   key_cache, value_cache: [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_SIZE] of CACHE_T, which is
//   the activation type T or an fp8 type of common.cuh (then 16-byte loads carry 16 elements)
//   token t of a sequence sits in block block_table[t / BLOCK_SIZE], row t % BLOCK_SIZE
//
// v1: one thread block per (head, sequence) streams all of the sequence's KV blocks.
// v2: one thread block per (head, sequence, partition of PARTITION_SIZE tokens) writes a partial
//     result with its max logit and exp sum; the reduce kernel rescales and sums the partitions.
//
// With a sliding window (> 0) a query sees its last `window` tokens only: blocks before the
// window's first are never read (the engine may have freed them). With softcap (> 0) scores
// become softcap * tanh(score / softcap) (Gemma 2). With sinks (not nullptr: one logit per head,
// gpt-oss) each head's softmax counts exp(sink) in its sum once, as a key of zero value. With
// alibi_slopes (not nullptr: one slope per head, BLOOM, MPT) the score of token t gains
// slope * (t - (context_len - 1)) after any soft cap.
#include "common.cuh"
#include "decode_tuning.cuh"
#include "decode_attend.cuh"

namespace pagedgen {

// Caps registers at 128 per thread: without a cap ptxas trades a few spills for occupancy, and the
// unrolled 16-byte loads already keep enough bytes in flight at 4 blocks of 128 threads per SM.
constexpr int kMinBlocksPerSm = PAGEDGEN_DECODE_MIN_BLOCKS;

// grid (num_heads, num_seqs), block NUM_THREADS
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS>
__global__ void __launch_bounds__(NUM_THREADS, kMinBlocksPerSm) paged_attention_v1_kernel(
    T* __restrict__ out,                      // [num_seqs, num_heads, HEAD_SIZE]
    const T* __restrict__ query,              // [num_seqs, num_heads, HEAD_SIZE], q_stride rows
    const CACHE_T* __restrict__ key_cache,    // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_SIZE]
    const CACHE_T* __restrict__ value_cache,  // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_SIZE]
    const int* __restrict__ block_tables,     // [num_seqs, max_num_blocks_per_seq]
    const int* __restrict__ context_lens,     // [num_seqs]
    int max_num_blocks_per_seq, int q_stride, int num_kv_heads, float scale, int window,
    float softcap, const float* __restrict__ sinks, const float* __restrict__ alibi_slopes) {
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int num_heads = gridDim.x;
  const int kv_head = head / (num_heads / num_kv_heads);
  const int context_len = context_lens[seq];
  attend<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS>(
      out + ((long long)seq * num_heads + head) * HEAD_SIZE,
      query + (long long)seq * q_stride + head * HEAD_SIZE, key_cache, value_cache,
      block_tables + (long long)seq * max_num_blocks_per_seq, kv_head, num_kv_heads, scale,
      window > 0 ? max(0, context_len - window) : 0, context_len, softcap,
      sinks == nullptr ? nullptr : sinks + head,
      alibi_slopes == nullptr ? 0.f : alibi_slopes[head], context_len - 1);
}

// grid (num_heads, num_seqs, max_num_partitions), block NUM_THREADS
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          int PARTITION_SIZE>
__global__ void __launch_bounds__(NUM_THREADS, kMinBlocksPerSm) paged_attention_v2_kernel(
    float* __restrict__ exp_sums,             // [num_seqs, num_heads, max_num_partitions]
    float* __restrict__ max_logits,           // [num_seqs, num_heads, max_num_partitions]
    float* __restrict__ tmp_out,              // [num_seqs, num_heads, max_num_partitions, HEAD]
    const T* __restrict__ query,              // [num_seqs, num_heads, HEAD_SIZE], q_stride rows
    const CACHE_T* __restrict__ key_cache,    // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_SIZE]
    const CACHE_T* __restrict__ value_cache,  // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_SIZE]
    const int* __restrict__ block_tables,     // [num_seqs, max_num_blocks_per_seq]
    const int* __restrict__ context_lens,     // [num_seqs]
    int max_num_blocks_per_seq, int q_stride, int num_kv_heads, float scale, int window,
    float softcap, const float* __restrict__ alibi_slopes) {
  static_assert(PARTITION_SIZE % BLOCK_SIZE == 0, "partitions start on a block boundary");
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int partition = blockIdx.z;
  const int num_heads = gridDim.x;
  const int context_len = context_lens[seq];
  const int window_start = window > 0 ? max(0, context_len - window) : 0;
  const int end_token = min((partition + 1) * PARTITION_SIZE, context_len);
  // Past the context or before the window: the reduce reads no partial of it. The whole thread
  // block leaves together.
  if (partition * PARTITION_SIZE >= context_len || end_token <= window_start) return;
  const int start_token = max(partition * PARTITION_SIZE, window_start);
  const int kv_head = head / (num_heads / num_kv_heads);
  const long long row = ((long long)seq * num_heads + head) * gridDim.z + partition;
  const Stats stats = attend<T, CACHE_T, HEAD_SIZE, BLOCK_SIZE, NUM_THREADS>(
      tmp_out + row * HEAD_SIZE, query + (long long)seq * q_stride + head * HEAD_SIZE, key_cache,
      value_cache, block_tables + (long long)seq * max_num_blocks_per_seq, kv_head, num_kv_heads,
      scale, start_token, end_token, softcap, nullptr,
      alibi_slopes == nullptr ? 0.f : alibi_slopes[head], context_len - 1);
  if (threadIdx.x == 0) {
    max_logits[row] = stats.max_logit;
    exp_sums[row] = stats.exp_sum;
  }
}

// grid (num_heads, num_seqs), block NUM_THREADS
template <typename T, int HEAD_SIZE, int NUM_THREADS, int PARTITION_SIZE>
__global__ void __launch_bounds__(NUM_THREADS, kMinBlocksPerSm) paged_attention_v2_reduce_kernel(
    T* __restrict__ out,                   // [num_seqs, num_heads, HEAD_SIZE]
    const float* __restrict__ exp_sums,    // [num_seqs, num_heads, max_num_partitions]
    const float* __restrict__ max_logits,  // [num_seqs, num_heads, max_num_partitions]
    const float* __restrict__ tmp_out,     // [num_seqs, num_heads, max_num_partitions, HEAD_SIZE]
    const int* __restrict__ context_lens,  // [num_seqs]
    int max_num_partitions, int window, const float* __restrict__ sinks) {
  const int head = blockIdx.x;
  const int seq = blockIdx.y;
  const int num_heads = gridDim.x;
  const int context_len = context_lens[seq];
  const int num_partitions = (context_len + PARTITION_SIZE - 1) / PARTITION_SIZE;
  const int first = window > 0 ? max(0, context_len - window) / PARTITION_SIZE : 0;
  const long long row = ((long long)seq * num_heads + head) * max_num_partitions;
  float max_logit = sinks == nullptr ? kNegMax : sinks[head];
  for (int p = first; p < num_partitions; ++p) max_logit = fmaxf(max_logit, max_logits[row + p]);
  float exp_sum = sinks == nullptr ? 0.f : __expf(sinks[head] - max_logit);
  for (int p = first; p < num_partitions; ++p) {
    exp_sum += exp_sums[row + p] * __expf(max_logits[row + p] - max_logit);
  }
  const float inv_sum = 1.f / exp_sum;
  for (int d = threadIdx.x; d < HEAD_SIZE; d += NUM_THREADS) {
    float o = 0.f;
    for (int p = first; p < num_partitions; ++p) {
      const float weight = exp_sums[row + p] * __expf(max_logits[row + p] - max_logit);
      o += tmp_out[(row + p) * HEAD_SIZE + d] * weight;
    }
    out[((long long)seq * num_heads + head) * HEAD_SIZE + d] = from_float<T>(o * inv_sum);
  }
}

}  // namespace pagedgen

// Explicit instantiations, with the launch constants of pagedgen/kernels/paged_attention.py.
// The runtime compiles one (scalar, cache type, head size, block size) per module and says which
// with -D; offline builds (nvcc -cubin in the tests) get every supported combination. The reduce
// kernel reads float partials only: one per scalar and head size, whatever the cache.
#define PAGEDGEN_PA_BLOCK(T, C, HEAD, BLOCK)                                                     \
  template __global__ void                                                                       \
  pagedgen::paged_attention_v1_kernel<T, C, HEAD, BLOCK, PAGEDGEN_DECODE_THREADS>(               \
      T*, const T*, const C*, const C*, const int*, const int*, int, int, int, float, int,     \
      float, const float*, const float*);                                                       \
  template __global__ void                                                                       \
  pagedgen::paged_attention_v2_kernel<T, C, HEAD, BLOCK, PAGEDGEN_DECODE_THREADS, 512>(          \
      float*, float*, float*, const T*, const C*, const C*, const int*, const int*, int, int,   \
      int, float, int, float, const float*);
#define PAGEDGEN_PA_REDUCE(T, HEAD)                                                              \
  template __global__ void pagedgen::paged_attention_v2_reduce_kernel<T, HEAD, 128, 512>(       \
      T*, const float*, const float*, const float*, const int*, int, int, const float*);
#define PAGEDGEN_PA_CACHE(T, C, HEAD) \
  PAGEDGEN_PA_BLOCK(T, C, HEAD, 8)    \
  PAGEDGEN_PA_BLOCK(T, C, HEAD, 16)   \
  PAGEDGEN_PA_BLOCK(T, C, HEAD, 32)
#define PAGEDGEN_PA_HEAD(T, HEAD)                   \
  PAGEDGEN_PA_CACHE(T, T, HEAD)                     \
  PAGEDGEN_PA_CACHE(T, pagedgen::fp8_e4m3, HEAD)    \
  PAGEDGEN_PA_CACHE(T, pagedgen::fp8_e5m2, HEAD)    \
  PAGEDGEN_PA_REDUCE(T, HEAD)
#define PAGEDGEN_PA_SCALAR(T) \
  PAGEDGEN_PA_HEAD(T, 64)     \
  PAGEDGEN_PA_HEAD(T, 80)     \
  PAGEDGEN_PA_HEAD(T, 96)     \
  PAGEDGEN_PA_HEAD(T, 128)    \
  PAGEDGEN_PA_HEAD(T, 256)

#if defined(PAGEDGEN_SCALAR_T)
PAGEDGEN_PA_BLOCK(PAGEDGEN_SCALAR_T, PAGEDGEN_CACHE_T, PAGEDGEN_HEAD_SIZE, PAGEDGEN_BLOCK_SIZE)
PAGEDGEN_PA_REDUCE(PAGEDGEN_SCALAR_T, PAGEDGEN_HEAD_SIZE)
#else
PAGEDGEN_PA_SCALAR(float)
PAGEDGEN_PA_SCALAR(__half)
PAGEDGEN_PA_SCALAR(__nv_bfloat16)
#endif
