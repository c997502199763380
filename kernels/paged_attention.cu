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
#include "kv_prefetch.cuh"

namespace pagedgen {

// Caps registers at 128 per thread: without a cap ptxas trades a few spills for occupancy, and the
// unrolled 16-byte loads already keep enough bytes in flight at 4 blocks of 128 threads per SM.
constexpr int kMinBlocksPerSm = 4;

struct Stats {
  float max_logit;
  float exp_sum;
};

// Attends q, at position q_pos, to tokens [start_token, end_token) and writes out[0:HEAD_SIZE],
// normalised (with *sink in the sum where sink is not nullptr).
//
// The warps take the KV blocks round robin, each keeping an online softmax: running max m, sum l
// and unnormalised accumulator acc, all rescaled by exp(m_old - m_new) when m grows. Lane roles
// inside a warp, for one KV block:
//   scores: lane = token * THREADS_PER_TOKEN + part; part p dots the 16-byte vectors p,
//           p + THREADS_PER_TOKEN, ... of the key; xor shuffles sum the parts.
//   values: lane = row * V_LANES + col; col owns the vectors col, col + V_LANES, ... of the
//           output, row the tokens row, row + V_ROWS, ...; rows are summed after the last block.
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          typename O>
__device__ Stats attend(O* __restrict__ out, const T* __restrict__ q,
                        const CACHE_T* __restrict__ key_cache,
                        const CACHE_T* __restrict__ value_cache,
                        const int* __restrict__ block_table, int kv_head, int num_kv_heads,
                        float scale, int start_token, int end_token, float softcap,
                        const float* sink, float alibi_slope, int q_pos) {
  constexpr int VEC = 16 / sizeof(CACHE_T);
  constexpr int NUM_VECS = HEAD_SIZE / VEC;
  constexpr int NUM_WARPS = NUM_THREADS / kWarpSize;
  constexpr int THREADS_PER_TOKEN = kWarpSize / BLOCK_SIZE;
  constexpr int K_VECS = (NUM_VECS + THREADS_PER_TOKEN - 1) / THREADS_PER_TOKEN;
  constexpr int V_LANES = pow2_ceil(NUM_VECS < kWarpSize ? NUM_VECS : kWarpSize);
  constexpr int V_ROWS = kWarpSize / V_LANES;
  constexpr int V_VECS = (NUM_VECS + V_LANES - 1) / V_LANES;
  static_assert(HEAD_SIZE % VEC == 0, "HEAD_SIZE must be a whole number of 16-byte vectors");
  static_assert(kWarpSize % BLOCK_SIZE == 0, "a warp scores a whole KV block at once");
  static_assert(NUM_THREADS % kWarpSize == 0, "NUM_THREADS must be whole warps");
  using KV = Vec<CACHE_T, VEC>;

  __shared__ float s_q[HEAD_SIZE];
  __shared__ float s_p[NUM_WARPS][BLOCK_SIZE];
  __shared__ float s_m[NUM_WARPS];
  __shared__ float s_l[NUM_WARPS];
  __shared__ float s_acc[NUM_WARPS][HEAD_SIZE];

  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  for (int i = tid; i < HEAD_SIZE; i += NUM_THREADS) s_q[i] = to_float(q[i]) * scale;
  __syncthreads();

  const int token_stride = num_kv_heads * HEAD_SIZE;
  const int token_in_block = lane / THREADS_PER_TOKEN;
  const int part = lane % THREADS_PER_TOKEN;
  const int v_row = lane / V_LANES;
  const int v_col = lane % V_LANES;

  float m = kNegMax;
  float l = 0.f;  // over the tokens this lane scored, counted by part 0 only
  float acc[V_VECS][VEC] = {};
  const int end_block = (end_token + BLOCK_SIZE - 1) / BLOCK_SIZE;
  for (int b = start_token / BLOCK_SIZE + warp; b < end_block; b += NUM_WARPS) {
    const long long block_offset =
        (long long)block_table[b] * BLOCK_SIZE * token_stride + kv_head * HEAD_SIZE;
    const int num_tokens = min(BLOCK_SIZE, end_token - b * BLOCK_SIZE);
    const int skipped = max(0, start_token - b * BLOCK_SIZE);  // the first block's, if partial
    const bool valid = token_in_block < num_tokens && token_in_block >= skipped;
    if (PAGEDGEN_L2_PREFETCH && b + NUM_WARPS < end_block) {
      prefetch_kv_block<CACHE_T, HEAD_SIZE, BLOCK_SIZE>(
          key_cache, value_cache,
          (long long)block_table[b + NUM_WARPS] * BLOCK_SIZE * token_stride + kv_head * HEAD_SIZE,
          token_stride, lane);
    }

    float score = 0.f;
    if (valid) {
      const CACHE_T* k = key_cache + block_offset + (long long)token_in_block * token_stride;
#pragma unroll 8
      for (int i = 0; i < K_VECS; ++i) {
        const int v = part + i * THREADS_PER_TOKEN;
        if (v < NUM_VECS) {
          const KV kv = *reinterpret_cast<const KV*>(k + v * VEC);
#pragma unroll
          for (int e = 0; e < VEC; ++e) score += s_q[v * VEC + e] * to_float(kv.data[e]);
        }
      }
    }
#pragma unroll
    for (int mask = THREADS_PER_TOKEN / 2; mask > 0; mask /= 2) {
      score += __shfl_xor_sync(kFullMask, score, mask);
    }
    if (softcap > 0.f) score = softcap * tanhf(score / softcap);
    score += alibi_slope * (float)(b * BLOCK_SIZE + token_in_block - q_pos);
    if (!valid) score = kNegMax;

    const float m_new = fmaxf(m, warp_max(score));
    const float alpha = __expf(m - m_new);
    const float p = valid ? __expf(score - m_new) : 0.f;
    m = m_new;
    l = l * alpha + (part == 0 ? p : 0.f);
    if (part == 0) s_p[warp][token_in_block] = p;
    __syncwarp();

#pragma unroll
    for (int i = 0; i < V_VECS; ++i) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[i][e] *= alpha;
    }
    // A fixed trip count, unrolled, so that the loads of every row's tokens are in flight at once.
#pragma unroll
    for (int j = 0; j < (BLOCK_SIZE + V_ROWS - 1) / V_ROWS; ++j) {
      const int t = v_row + j * V_ROWS;
      if (t < skipped || t >= num_tokens) continue;  // out of the window or the context
      const float pt = s_p[warp][t];
      const CACHE_T* v_token = value_cache + block_offset + (long long)t * token_stride;
#pragma unroll
      for (int i = 0; i < V_VECS; ++i) {
        const int v = v_col + i * V_LANES;
        if (v < NUM_VECS) {
          const KV vv = *reinterpret_cast<const KV*>(v_token + v * VEC);
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[i][e] += pt * to_float(vv.data[e]);
        }
      }
    }
    __syncwarp();  // s_p[warp] is rewritten for the next block
  }

  // Rows of a warp hold disjoint tokens under the same m, so they simply add up.
#pragma unroll
  for (int i = 0; i < V_VECS; ++i) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
#pragma unroll
      for (int mask = V_LANES; mask < kWarpSize; mask *= 2) {
        acc[i][e] += __shfl_xor_sync(kFullMask, acc[i][e], mask);
      }
    }
  }
  l = warp_sum(l);
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
  if (v_row == 0) {
#pragma unroll
    for (int i = 0; i < V_VECS; ++i) {
      const int v = v_col + i * V_LANES;
      if (v < NUM_VECS) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) s_acc[warp][v * VEC + e] = acc[i][e];
      }
    }
  }
  __syncthreads();

  // A warp that got no block has m = kNegMax and weighs exp(kNegMax - max_logit) = 0.
  Stats stats = {kNegMax, 0.f};
#pragma unroll
  for (int w = 0; w < NUM_WARPS; ++w) stats.max_logit = fmaxf(stats.max_logit, s_m[w]);
  if (sink != nullptr) stats.max_logit = fmaxf(stats.max_logit, *sink);
  float weights[NUM_WARPS];
#pragma unroll
  for (int w = 0; w < NUM_WARPS; ++w) {
    weights[w] = __expf(s_m[w] - stats.max_logit);
    stats.exp_sum += s_l[w] * weights[w];
  }
  if (sink != nullptr) stats.exp_sum += __expf(*sink - stats.max_logit);
  const float inv_sum = 1.f / stats.exp_sum;
  for (int d = tid; d < HEAD_SIZE; d += NUM_THREADS) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) o += s_acc[w][d] * weights[w];
    out[d] = from_float<O>(o * inv_sum);
  }
  return stats;
}

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
  template __global__ void pagedgen::paged_attention_v1_kernel<T, C, HEAD, BLOCK, 128>(         \
      T*, const T*, const C*, const C*, const int*, const int*, int, int, int, float, int,     \
      float, const float*, const float*);                                                       \
  template __global__ void pagedgen::paged_attention_v2_kernel<T, C, HEAD, BLOCK, 128, 512>(    \
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
