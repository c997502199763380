// The body of the GQA-grouped decode kernels of paged_attention_grouped.cu (layout and
// semantics there): one thread block attends a tile of one kv head's query heads, for one
// sequence, to a range of its tokens.
#pragma once

#include "common.cuh"
#include "kv_prefetch.cuh"

namespace pagedgen {

// Attends the tile's queries q[g * HEAD_SIZE ...], g < num_q_heads, to tokens
// [start_token, end_token); writes head g's normalised output at out + g * out_head_stride and,
// when max_logits is not null, its max logit and exp sum at g * stats_head_stride.
//
// Warps take KV blocks round robin with an online softmax per head (running max m, sum l,
// accumulator acc, rescaled by alpha = exp(m_old - m_new)). Lane roles inside a warp, per block:
//   scores: lane = token * THREADS_PER_TOKEN + part, as in paged_attention.cu; the lane loads its
//           key vectors once and dots each with all GROUP_TILE queries (float4 reads of s_q).
//   values: lane = (row * V_SLICES + slice) * V_LANES + col; col owns vectors col, col + V_LANES,
//           ... of the output, slice the heads slice * SLICE_HEADS ... + SLICE_HEADS - 1, row the
//           tokens row, row + V_ROWS, ...; slices of one col load the same address in the same
//           instruction, so a value vector is fetched once for every head.
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS,
          int GROUP_TILE, typename O>
__device__ void attend_group(O* __restrict__ out, long long out_head_stride,
                             float* __restrict__ max_logits, float* __restrict__ exp_sums,
                             long long stats_head_stride, const T* __restrict__ q, int num_q_heads,
                             const CACHE_T* __restrict__ key_cache,
                             const CACHE_T* __restrict__ value_cache,
                             const int* __restrict__ block_table, int kv_head, int num_kv_heads,
                             float scale, int start_token, int end_token) {
  // 16-byte vectors of a 16-bit or float cache; an fp8 cache loads 8 bytes, as 16 elements a lane
  // would spill the tile's scores.
  constexpr int VEC = sizeof(CACHE_T) == 1 ? 8 : 16 / sizeof(CACHE_T);
  constexpr int NUM_VECS = HEAD_SIZE / VEC;
  constexpr int NUM_WARPS = NUM_THREADS / kWarpSize;
  constexpr int THREADS_PER_TOKEN = kWarpSize / BLOCK_SIZE;
  constexpr int K_VECS = (NUM_VECS + THREADS_PER_TOKEN - 1) / THREADS_PER_TOKEN;
  constexpr int V_LANES = pow2_ceil(NUM_VECS < kWarpSize ? NUM_VECS : kWarpSize);
  constexpr int V_SLICES = kWarpSize / V_LANES < GROUP_TILE ? kWarpSize / V_LANES : GROUP_TILE;
  constexpr int V_ROWS = kWarpSize / (V_LANES * V_SLICES);
  constexpr int SLICE_HEADS = GROUP_TILE / V_SLICES;
  constexpr int V_VECS = (NUM_VECS + V_LANES - 1) / V_LANES;
  // Key vectors and value tokens in flight per lane, as many as the registers left beside the
  // scores (GROUP_TILE) and the accumulators (SLICE_HEADS * V_VECS * VEC) allow without spills.
  // (-D PAGEDGEN_K_UNROLL / PAGEDGEN_V_UNROLL override them for benchmarks/sweep_decode.py.)
#ifdef PAGEDGEN_K_UNROLL
  constexpr int K_UNROLL = PAGEDGEN_K_UNROLL;
#else
  constexpr int K_UNROLL = GROUP_TILE > 4 ? 2 : 8;
#endif
#ifdef PAGEDGEN_V_UNROLL
  constexpr int V_UNROLL = PAGEDGEN_V_UNROLL;
#else
  constexpr int V_UNROLL = SLICE_HEADS * V_VECS * VEC > 16 ? 4 : 8;
#endif
  static_assert(HEAD_SIZE % VEC == 0 && VEC % 4 == 0, "whole vectors of whole float4s");
  static_assert(kWarpSize % BLOCK_SIZE == 0, "a warp scores a whole KV block at once");
  static_assert(NUM_THREADS % kWarpSize == 0, "NUM_THREADS must be whole warps");
  static_assert(pow2_ceil(GROUP_TILE) == GROUP_TILE, "slices split the tile evenly");
  using KV = Vec<CACHE_T, VEC>;
  using F4 = Vec<float, 4>;

  __shared__ F4 s_q[GROUP_TILE][HEAD_SIZE / 4];
  __shared__ float s_p[NUM_WARPS][BLOCK_SIZE][GROUP_TILE];
  __shared__ float s_alpha[NUM_WARPS][GROUP_TILE];
  __shared__ float s_m[NUM_WARPS][GROUP_TILE];
  __shared__ float s_l[NUM_WARPS][GROUP_TILE];
  __shared__ float s_weight[NUM_WARPS][GROUP_TILE];  // exp(m_warp - max) / exp_sum
  __shared__ float s_acc[NUM_WARPS][GROUP_TILE][HEAD_SIZE];

  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  for (int i = tid; i < GROUP_TILE * HEAD_SIZE / 4; i += NUM_THREADS) {
    const int g = i / (HEAD_SIZE / 4);
    const int d = i % (HEAD_SIZE / 4) * 4;
    F4 x;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      x.data[e] = g < num_q_heads ? to_float(q[g * HEAD_SIZE + d + e]) * scale : 0.f;
    }
    s_q[g][d / 4] = x;
  }
  __syncthreads();

  const int token_stride = num_kv_heads * HEAD_SIZE;
  const int token_in_block = lane / THREADS_PER_TOKEN;
  const int part = lane % THREADS_PER_TOKEN;
  const int v_col = lane % V_LANES;
  const int v_slice = lane / V_LANES % V_SLICES;
  const int v_row = lane / (V_LANES * V_SLICES);
  const int first_slice_head = v_slice * SLICE_HEADS;

  // The warp's running max and sum per head live in shared memory (registers go to acc); lane g
  // owns s_l[warp][g], lane 0 writes s_m[warp][g] after the shuffles that every lane's read of it
  // precedes.
  if (lane < GROUP_TILE) {
    s_m[warp][lane] = kNegMax;
    s_l[warp][lane] = 0.f;
  }
  __syncwarp();
  float acc[SLICE_HEADS][V_VECS][VEC] = {};
  const int end_block = (end_token + BLOCK_SIZE - 1) / BLOCK_SIZE;
  for (int b = start_token / BLOCK_SIZE + warp; b < end_block; b += NUM_WARPS) {
    const long long block_offset =
        (long long)block_table[b] * BLOCK_SIZE * token_stride + kv_head * HEAD_SIZE;
    const int num_tokens = min(BLOCK_SIZE, end_token - b * BLOCK_SIZE);
    prefetch_next_kv_block<CACHE_T, HEAD_SIZE, BLOCK_SIZE>(
        key_cache, value_cache, block_table, b + NUM_WARPS, end_block, kv_head, token_stride, lane);

    float score[GROUP_TILE] = {};
    if (token_in_block < num_tokens) {
      const CACHE_T* k = key_cache + block_offset + (long long)token_in_block * token_stride;
#pragma unroll K_UNROLL
      for (int i = 0; i < K_VECS; ++i) {
        const int v = part + i * THREADS_PER_TOKEN;
        if (v < NUM_VECS) {
          const KV kv = *reinterpret_cast<const KV*>(k + v * VEC);
          float kf[VEC];
#pragma unroll
          for (int e = 0; e < VEC; ++e) kf[e] = to_float(kv.data[e]);
#pragma unroll
          for (int g = 0; g < GROUP_TILE; ++g) {
#pragma unroll
            for (int j = 0; j < VEC / 4; ++j) {
              const F4 q4 = s_q[g][v * (VEC / 4) + j];
#pragma unroll
              for (int e = 0; e < 4; ++e) score[g] += q4.data[e] * kf[j * 4 + e];
            }
          }
        }
      }
    }
#pragma unroll
    for (int g = 0; g < GROUP_TILE; ++g) {
#pragma unroll
      for (int mask = THREADS_PER_TOKEN / 2; mask > 0; mask /= 2) {
        score[g] += __shfl_xor_sync(kFullMask, score[g], mask);
      }
      if (token_in_block >= num_tokens) score[g] = kNegMax;
      const float m_old = s_m[warp][g];
      const float m_new = fmaxf(m_old, warp_max(score[g]));
      const float p = token_in_block < num_tokens ? __expf(score[g] - m_new) : 0.f;
      if (part == 0) s_p[warp][token_in_block][g] = p;
      if (lane == 0) {
        s_m[warp][g] = m_new;
        s_alpha[warp][g] = __expf(m_old - m_new);
      }
    }
    __syncwarp();
    if (lane < GROUP_TILE) {
      float block_sum = 0.f;
#pragma unroll
      for (int t = 0; t < BLOCK_SIZE; ++t) block_sum += s_p[warp][t][lane];  // 0 past num_tokens
      s_l[warp][lane] = s_l[warp][lane] * s_alpha[warp][lane] + block_sum;
    }

#pragma unroll
    for (int h = 0; h < SLICE_HEADS; ++h) {
      const float alpha = s_alpha[warp][first_slice_head + h];
#pragma unroll
      for (int i = 0; i < V_VECS; ++i) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[h][i][e] *= alpha;
      }
    }
#pragma unroll V_UNROLL
    for (int t = v_row; t < BLOCK_SIZE; t += V_ROWS) {
      if (t < num_tokens) {
        const CACHE_T* v_token = value_cache + block_offset + (long long)t * token_stride;
#pragma unroll
        for (int i = 0; i < V_VECS; ++i) {
          const int v = v_col + i * V_LANES;
          if (v < NUM_VECS) {
            const KV vv = *reinterpret_cast<const KV*>(v_token + v * VEC);
#pragma unroll
            for (int h = 0; h < SLICE_HEADS; ++h) {
              const float pt = s_p[warp][t][first_slice_head + h];
#pragma unroll
              for (int e = 0; e < VEC; ++e) acc[h][i][e] += pt * to_float(vv.data[e]);
            }
          }
        }
      }
    }
    __syncwarp();  // s_p[warp] and s_alpha[warp] are rewritten for the next block
  }

  // Rows of a warp hold disjoint tokens under the same m, so they simply add up.
#pragma unroll
  for (int h = 0; h < SLICE_HEADS; ++h) {
#pragma unroll
    for (int i = 0; i < V_VECS; ++i) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
#pragma unroll
        for (int mask = V_LANES * V_SLICES; mask < kWarpSize; mask *= 2) {
          acc[h][i][e] += __shfl_xor_sync(kFullMask, acc[h][i][e], mask);
        }
      }
    }
  }
  if (v_row == 0) {
#pragma unroll
    for (int h = 0; h < SLICE_HEADS; ++h) {
#pragma unroll
      for (int i = 0; i < V_VECS; ++i) {
        const int v = v_col + i * V_LANES;
        if (v < NUM_VECS) {
          float* dst = &s_acc[warp][first_slice_head + h][v * VEC];
#pragma unroll
          for (int e = 0; e < VEC; ++e) dst[e] = acc[h][i][e];
        }
      }
    }
  }
  __syncthreads();

  // A warp that got no block has m = kNegMax and weighs exp(kNegMax - max_logit) = 0.
  if (tid < GROUP_TILE) {
    const int g = tid;
    float max_logit = kNegMax;
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) max_logit = fmaxf(max_logit, s_m[w][g]);
    float exp_sum = 0.f;
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) exp_sum += s_l[w][g] * __expf(s_m[w][g] - max_logit);
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) {
      s_weight[w][g] = __expf(s_m[w][g] - max_logit) / exp_sum;
    }
    if (max_logits != nullptr && g < num_q_heads) {
      max_logits[g * stats_head_stride] = max_logit;
      exp_sums[g * stats_head_stride] = exp_sum;
    }
  }
  __syncthreads();
  for (int i = tid; i < num_q_heads * HEAD_SIZE; i += NUM_THREADS) {
    const int g = i / HEAD_SIZE;
    const int d = i % HEAD_SIZE;
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) o += s_acc[w][g][d] * s_weight[w][g];
    out[g * out_head_stride + d] = from_float<O>(o);
  }
}

}  // namespace pagedgen
