// The body of the per-head decode kernels of paged_attention.cu (layout and semantics there):
// one thread block attends one query head of one sequence to a range of its tokens.
#pragma once

#include "common.cuh"
#include "kv_prefetch.cuh"

namespace pagedgen {

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
    prefetch_next_kv_block<CACHE_T, HEAD_SIZE, BLOCK_SIZE>(
        key_cache, value_cache, block_table, b + NUM_WARPS, end_block, kv_head, token_stride, lane);

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

}  // namespace pagedgen
