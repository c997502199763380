// The body of the tensor-core decode kernels of paged_attention_mma.cu (layout and semantics
// there): one thread block attends a tile of up to 16 query heads of one kv head, for one
// sequence, to a range of its tokens, with S = Q K^T and O = P V on mma.sync.m16n8k16 (the tile's
// heads are A's 16 rows; rows past the tile are zero and never written).
#pragma once

#include "common.cuh"
#include "kv_tiles.cuh"
#include "mma.cuh"
#include "mma_attention.cuh"

namespace pagedgen {

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * kWarpSize;
constexpr int kWarpTokens = 16;                        // one k-step of P V
constexpr int kChunkTokens = kMmaWarps * kWarpTokens;  // a pipeline stage: each warp its 16
constexpr int kTileHeads = 16;                         // mma's M

// Compile-time knobs for benchmarks/sweep_decode.py (pagedgen/kernels/decode_tuning.py), unset
// for the engine: pipeline stages (0: 3, or 2 for heads past 128) and the blocks an SM
// __launch_bounds__ budgets registers for (0: kMmaMinBlocks' table).
#ifndef PAGEDGEN_MMA_STAGES
#define PAGEDGEN_MMA_STAGES 0
#endif
#ifndef PAGEDGEN_MMA_MIN_BLOCKS
#define PAGEDGEN_MMA_MIN_BLOCKS 0
#endif

// Shared memory (kv_tiles.cuh's swizzled pieces): the Q tile [kTileHeads][ROW], then K and V,
// each [STAGES][kChunkTokens][ROW]. After the last stage, the K/V space holds each warp's float
// partial output and statistics. pagedgen/kernels/paged_attention_mma.py computes kSharedBytes
// (and kStages) the same way.
template <int HEAD_SIZE>
struct MmaLayout {
  static constexpr int kRow = HEAD_SIZE / 8;
  static constexpr int kStages =
      PAGEDGEN_MMA_STAGES > 0 ? PAGEDGEN_MMA_STAGES : HEAD_SIZE > 128 ? 2 : 3;
  static_assert(kStages >= 2, "a stage is read while the next one lands");
  static constexpr int kQBytes = kTileHeads * HEAD_SIZE * 2;
  static constexpr int kStageBytes = kChunkTokens * HEAD_SIZE * 2;  // K or V
  static constexpr int kSharedBytes = kQBytes + 2 * kStages * kStageBytes;
  static constexpr int kCombineBytes = kMmaWarps * kTileHeads * (HEAD_SIZE + 2) * 4;
  static_assert(kCombineBytes <= 2 * kStages * kStageBytes, "the combine fits in the K/V space");

  __device__ static int piece(int row, int p) { return swizzled_piece<kRow>(row, p); }
};

// The blocks an SM holds at kSharedBytes (228 KB on an H100, 164 KB on an A100), which
// __launch_bounds__ budgets registers for.
template <int HEAD_SIZE>
constexpr int kMmaMinBlocks = PAGEDGEN_MMA_MIN_BLOCKS > 0 ? PAGEDGEN_MMA_MIN_BLOCKS
                              : HEAD_SIZE <= 64                ? 4
                              : HEAD_SIZE <= 128               ? 2
                                                               : 1;

// What the tile's queries see beyond their plain scores: paged_attention.cu's options.
struct MmaDecodeOptions {
  int visible_from;     // the first token they see (a window's start): earlier ones score nothing
  float softcap;        // > 0: scores become softcap * tanh(score / softcap)
  const float* slopes;  // ALiBi's slope of each head of the tile, or nullptr
  int query_pos;        // the queries' position, for ALiBi's slope * (token - query_pos)
  const float* sinks;   // the sink logit of each head of the tile, counted once, or nullptr
};

// Attends q[g * HEAD_SIZE ...], g < num_q_heads, to tokens [start_token, end_token) (start_token on
// a KV block boundary) that it sees; writes head g's normalised output at out + g *
// out_head_stride and, when max_logits is not null, its max logit and exp sum at g *
// stats_head_stride.
//
// Chunk c (kChunkTokens tokens) is copied into stage c % STAGES by every thread, STAGES - 1
// chunks ahead of the one the warps read; warp w reads its 16 tokens of each chunk with an online
// softmax of its own (running max m and sum l per row, rescaled by alpha = exp(m_old - m_new)),
// and the warps' results are combined at the end. Tokens outside [visible_from, end_token) are
// copied as zeros and score kNegMax, so pool rows that were never written (NaN, say), or that a
// window let the engine free, reach no product.
template <typename T, int HEAD_SIZE, int BLOCK_SIZE, typename O>
__device__ void attend_mma(O* __restrict__ out, long long out_head_stride,
                           float* __restrict__ max_logits, float* __restrict__ exp_sums,
                           long long stats_head_stride, const T* __restrict__ q, int num_q_heads,
                           const T* __restrict__ key_cache, const T* __restrict__ value_cache,
                           const int* __restrict__ block_table, int kv_head, int num_kv_heads,
                           float scale, int start_token, int end_token,
                           const MmaDecodeOptions& options) {
  using L = MmaLayout<HEAD_SIZE>;
  constexpr int kStages = L::kStages;
  constexpr int kKSteps = HEAD_SIZE / 16;
  PAGEDGEN_DYNAMIC_SHARED(smem, L::kSharedBytes);
  T* s_q = reinterpret_cast<T*>(smem);
  Piece* s_k = reinterpret_cast<Piece*>(smem + L::kQBytes);
  Piece* s_v = s_k + kStages * kChunkTokens * L::kRow;

  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const int group = lane / 4;
  const int quad = lane % 4;
  const int num_chunks = (end_token - start_token + kChunkTokens - 1) / kChunkTokens;

  const KvTileLoader<T, HEAD_SIZE, BLOCK_SIZE, kChunkTokens, kMmaThreads> loader(
      key_cache, value_cache, block_table, kv_head, num_kv_heads);
  // Partitions start on a block boundary, so do chunks; a chunk's blocks are read a chunk ahead.
  auto chunk_blocks = [&](int chunk) {
    return loader.blocks(start_token + chunk * kChunkTokens, end_token);
  };
  auto load_chunk = [&](int chunk, int blocks) {
    if (chunk < num_chunks) {
      loader.load(s_k, s_v, chunk % kStages * kChunkTokens, start_token + chunk * kChunkTokens,
                  options.visible_from, end_token, blocks);
    }
    cp_async_commit();  // empty past the last chunk: every iteration's wait counts the same
  };
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) load_chunk(c, chunk_blocks(c));
  int next_blocks = chunk_blocks(kStages - 1);

  for (int i = tid; i < kTileHeads * HEAD_SIZE; i += kMmaThreads) {
    const int row = i / HEAD_SIZE;
    const int d = i % HEAD_SIZE;
    s_q[L::piece(row, d / 8) * 8 + d % 8] = row < num_q_heads ? q[row * HEAD_SIZE + d]
                                                                : from_float<T>(0.f);
  }
  __syncthreads();
  // Heads of 256 reload Q's fragments every chunk: with the output's 128 registers they would
  // spill.
  constexpr bool kQInRegisters = HEAD_SIZE <= 128;
  const Piece* q_tile = reinterpret_cast<const Piece*>(s_q);
  unsigned qa[kQInRegisters ? kKSteps : 1][4];
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) load_a_fragment<L::kRow>(qa[ks], q_tile, 0, ks);
  }

  float o[HEAD_SIZE / 8][4] = {};
  float m[2] = {kNegMax, kNegMax};  // rows group and group + 8
  float l[2] = {0.f, 0.f};          // this lane's share of the row sums
  float slope[2];                   // ALiBi's, 0 without and past the tile's heads
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = group + 8 * r;
    slope[r] = options.slopes != nullptr && row < num_q_heads ? options.slopes[row] : 0.f;
  }
  for (int chunk = 0; chunk < num_chunks; ++chunk) {
    cp_async_wait<kStages - 2>();  // this thread's copies of chunk have landed
    __syncthreads();               // everyone's have, and chunk - 1's stage is read: refill it
    load_chunk(chunk + kStages - 1, next_blocks);
    next_blocks = chunk_blocks(chunk + kStages);
    const int first = start_token + chunk * kChunkTokens + warp * kWarpTokens;
    // Warp-uniform: the warp's tokens are all past the end or before the window.
    if (first >= end_token || first + kWarpTokens <= options.visible_from) continue;
    const int warp_row = chunk % kStages * kChunkTokens + warp * kWarpTokens;

    // S (16 heads x 16 tokens) as two n-tiles of 8 tokens.
    float s[2][4];
    mma_scores<T, HEAD_SIZE, 2, kQInRegisters>(s, qa, q_tile, 0, s_k, warp_row);
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int token = first + n * 8 + 2 * quad + i % 2;
        float score = s[n][i] * scale;
        if (options.softcap > 0.f) score = options.softcap * tanhf(score / options.softcap);
        score += slope[i / 2] * (float)(token - options.query_pos);
        s[n][i] = token >= options.visible_from && token < end_token ? score : kNegMax;
      }
    }
    online_softmax(s, m, l, o);
    mma_pv<T, HEAD_SIZE>(o, s, s_v, warp_row);
  }
  cp_async_wait<0>();
  __syncthreads();  // the K/V space is free for the combine

  float* s_o = reinterpret_cast<float*>(s_k);                  // [warps][kTileHeads][HEAD_SIZE]
  float* s_m = s_o + kMmaWarps * kTileHeads * HEAD_SIZE;        // [warps][kTileHeads]
  float* s_l = s_m + kMmaWarps * kTileHeads;                    // [warps][kTileHeads]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(kFullMask, l[r], 1);
    l[r] += __shfl_xor_sync(kFullMask, l[r], 2);
    const int row = group + 8 * r;
    if (quad == 0) {
      s_m[warp * kTileHeads + row] = m[r];
      s_l[warp * kTileHeads + row] = l[r];
    }
#pragma unroll
    for (int t = 0; t < HEAD_SIZE / 8; ++t) {
      float* dst = &s_o[(warp * kTileHeads + row) * HEAD_SIZE + t * 8 + 2 * quad];
      dst[0] = o[t][2 * r];
      dst[1] = o[t][2 * r + 1];
    }
  }
  __syncthreads();

  // A warp that saw no token has m = kNegMax and weighs exp(kNegMax - max_logit) = 0; some warp
  // sees one (visible_from < end_token). A sink is one more logit in the sum, of zero value. Head
  // g's weights go to s_l in place of its sums.
  if (tid < num_q_heads) {
    const int g = tid;
    float max_logit = options.sinks != nullptr ? options.sinks[g] : kNegMax;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) max_logit = fmaxf(max_logit, s_m[w * kTileHeads + g]);
    float exp_sum = options.sinks != nullptr ? __expf(options.sinks[g] - max_logit) : 0.f;
    float weight[kMmaWarps];
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) {
      weight[w] = __expf(s_m[w * kTileHeads + g] - max_logit);
      exp_sum += s_l[w * kTileHeads + g] * weight[w];
    }
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) s_l[w * kTileHeads + g] = weight[w] / exp_sum;
    if (max_logits != nullptr) {
      max_logits[g * stats_head_stride] = max_logit;
      exp_sums[g * stats_head_stride] = exp_sum;
    }
  }
  __syncthreads();
  for (int i = tid; i < num_q_heads * HEAD_SIZE; i += kMmaThreads) {
    const int g = i / HEAD_SIZE;
    const int d = i % HEAD_SIZE;
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) {
      acc += s_o[(w * kTileHeads + g) * HEAD_SIZE + d] * s_l[w * kTileHeads + g];
    }
    out[g * out_head_stride + d] = from_float<O>(acc);
  }
}

}  // namespace pagedgen
