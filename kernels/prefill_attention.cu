// Prefill and chunked-prefill attention over the paged KV cache: one launch for every prefill row
// of a step, FlashAttention-style, with the step's K/V already written to the cache.
//
// Cache layout, shared with the PyTorch backend and the decode kernel:
//   key_cache, value_cache: [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_SIZE] of CACHE_T (T or fp8)
//   position p of a sequence sits in block block_table[p / BLOCK_SIZE], row p % BLOCK_SIZE
//
// Sequence s owns query rows cu_seqlens_q[s]..cu_seqlens_q[s + 1], the last query_len of its
// context_len tokens, so its query token i sits at position context_len - query_len + i and sees
// positions (p - window, p] (all of 0..p without a window). With ALiBi its score of position k
// gains slope * (k - p), after any soft cap.
//
// One thread block per (kv head, tile of BLOCK_M query rows, sequence). A GQA group is packed
// into the rows: row m of the sequence is token m / group, query head kv_head * group + m % group,
// so every head of the group shares each K/V tile loaded to shared memory. Each warp owns
// ROWS_PER_WARP rows and keeps, per row, an online softmax: running max m, sum l and unnormalised
// accumulator acc, rescaled by exp(m_old - m_new) when m grows.
#include "common.cuh"
#include "prefill_tile.cuh"

namespace pagedgen {

constexpr int kPrefillWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kPrefillRows = kPrefillWarps * kRowsPerWarp;  // BLOCK_M
constexpr int kPrefillThreads = kPrefillWarps * kWarpSize;
// Shared memory allows about 5 thread blocks per SM; without a minimum ptxas caps registers at 80
// and spills for head size 256.
constexpr int kPrefillMinBlocksPerSm = 4;

// Keys per tile: one per lane up to head size 128; fewer, split over lanes, so that the float
// tiles of a 256 head stay in 48 KiB of static shared memory.
__host__ __device__ constexpr int prefill_tile_keys(int head_size) {
  return head_size <= 128 ? 32 : 8;
}

// grid (num_kv_heads, ceil(max_query_len * group / BLOCK_M), num_seqs), block kPrefillThreads
template <typename T, typename CACHE_T, int HEAD_SIZE, int BLOCK_SIZE>
__global__ void __launch_bounds__(kPrefillThreads, kPrefillMinBlocksPerSm) prefill_attention_kernel(
    T* __restrict__ out,                      // [num_tokens, num_kv_heads * group, HEAD_SIZE]
    const T* __restrict__ query,              // [num_tokens, num_kv_heads * group, HEAD], strided
    const CACHE_T* __restrict__ key_cache,    // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_SIZE]
    const CACHE_T* __restrict__ value_cache,  // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_SIZE]
    const int* __restrict__ block_tables,     // [num_seqs, max_num_blocks_per_seq]
    const int* __restrict__ cu_seqlens_q,     // [num_seqs + 1], rows of query and out
    const int* __restrict__ context_lens,     // [num_seqs]
    int max_num_blocks_per_seq, int q_stride, int group, float scale,
    int window,                       // 0: none
    float softcap,                    // 0: none
    const float* __restrict__ sinks,    // [num_heads] or nullptr: a logit in each softmax
    const float* __restrict__ alibi_slopes) {  // [num_heads] or nullptr: ALiBi's
  constexpr int TILE_KEYS = prefill_tile_keys(HEAD_SIZE);
  constexpr int LANES_PER_KEY = kWarpSize / TILE_KEYS;
  constexpr int SCORE_DIMS = HEAD_SIZE / LANES_PER_KEY;
  constexpr int OUT_DIMS = (HEAD_SIZE + kWarpSize - 1) / kWarpSize;
  // A row stride of HEAD_SIZE + LANES_PER_KEY floats puts the lanes scoring one tile in
  // distinct banks.
  constexpr int KV_STRIDE = HEAD_SIZE + LANES_PER_KEY;
  constexpr int VEC = 16 / sizeof(CACHE_T);
  constexpr int NUM_VECS = HEAD_SIZE / VEC;
  static_assert(HEAD_SIZE % VEC == 0, "HEAD_SIZE must be a whole number of 16-byte vectors");
  static_assert(HEAD_SIZE % LANES_PER_KEY == 0, "lanes of a key split its dims evenly");
  using KV = Vec<CACHE_T, VEC>;

  __shared__ float s_q[kPrefillRows][HEAD_SIZE];
  __shared__ float s_k[TILE_KEYS][KV_STRIDE];
  __shared__ float s_v[TILE_KEYS][KV_STRIDE];
  __shared__ float s_p[kPrefillWarps][kRowsPerWarp][TILE_KEYS];

  const PrefillTile tile = prefill_tile<kPrefillRows>(cu_seqlens_q, context_lens, block_tables,
                                                  max_num_blocks_per_seq, group, window);
  if (tile.num_rows <= 0) return;  // the whole thread block leaves together
  const int kv_head = tile.kv_head, num_heads = tile.num_heads, first_row = tile.first_row;
  const int tile_row = tile.tile_row, num_rows = tile.num_rows, first_pos = tile.first_pos;
  const int kv_begin = tile.kv_begin, kv_end = tile.kv_end;
  const int* block_table = tile.block_table;
  const int num_kv_heads = gridDim.x;

  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  for (int i = tid; i < kPrefillRows * HEAD_SIZE; i += kPrefillThreads) {
    const int m = i / HEAD_SIZE, d = i % HEAD_SIZE;
    const int row = tile_row + m;
    float q = 0.f;
    if (m < num_rows) {
      const int head = kv_head * group + row % group;
      q = to_float(query[(long long)(first_row + row / group) * q_stride + head * HEAD_SIZE + d]);
    }
    s_q[m][d] = q * scale;
  }

  int q_pos[kRowsPerWarp];  // -1: a row past the tile's end, which sees nothing
  float slope[kRowsPerWarp];  // ALiBi's, 0 without
  float m_run[kRowsPerWarp], l_run[kRowsPerWarp], acc[kRowsPerWarp][OUT_DIMS];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int m = warp * kRowsPerWarp + r;
    q_pos[r] = m < num_rows ? first_pos + (tile_row + m) / group : -1;
    slope[r] = m < num_rows && alibi_slopes != nullptr
                   ? alibi_slopes[kv_head * group + (tile_row + m) % group]
                   : 0.f;
    m_run[r] = kNegMax;
    l_run[r] = 0.f;
#pragma unroll
    for (int j = 0; j < OUT_DIMS; ++j) acc[r][j] = 0.f;
  }

  const int key = lane / LANES_PER_KEY;
  const int part = lane % LANES_PER_KEY;
  const int token_stride = num_kv_heads * HEAD_SIZE;
  for (int tile = kv_begin / TILE_KEYS * TILE_KEYS; tile < kv_end; tile += TILE_KEYS) {
    __syncthreads();  // every warp is done with the previous tile
    for (int i = tid; i < TILE_KEYS * NUM_VECS; i += kPrefillThreads) {
      const int t = i / NUM_VECS, v = i % NUM_VECS;
      const int pos = tile + t;
      KV kv = {}, vv = {};
      if (pos >= kv_begin && pos < kv_end) {
        const long long offset = ((long long)block_table[pos / BLOCK_SIZE] * BLOCK_SIZE +
                                  pos % BLOCK_SIZE) * token_stride +
                                 kv_head * HEAD_SIZE + v * VEC;
        kv = *reinterpret_cast<const KV*>(key_cache + offset);
        vv = *reinterpret_cast<const KV*>(value_cache + offset);
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        s_k[t][v * VEC + e] = to_float(kv.data[e]);
        s_v[t][v * VEC + e] = to_float(vv.data[e]);
      }
    }
    __syncthreads();

    float score[kRowsPerWarp] = {};
#pragma unroll 4
    for (int i = 0; i < SCORE_DIMS; ++i) {
      const int d = part + i * LANES_PER_KEY;
      const float k = s_k[key][d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) score[r] += s_q[warp * kRowsPerWarp + r][d] * k;
    }
    const int pos = tile + key;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
      for (int mask = LANES_PER_KEY / 2; mask > 0; mask /= 2) {
        score[r] += __shfl_xor_sync(kFullMask, score[r], mask);
      }
      if (softcap > 0.f) score[r] = softcap * tanhf(score[r] / softcap);
      score[r] += slope[r] * (float)(pos - q_pos[r]);
      // Masked keys may be zeros of an unloaded slot, never read as data.
      const bool visible = pos <= q_pos[r] && (window <= 0 || pos > q_pos[r] - window);
      const float m_new = fmaxf(m_run[r], warp_max(visible ? score[r] : kNegMax));
      const float alpha = __expf(m_run[r] - m_new);
      const float p = visible ? __expf(score[r] - m_new) : 0.f;
      m_run[r] = m_new;
      l_run[r] = l_run[r] * alpha + warp_sum(part == 0 ? p : 0.f);
      if (part == 0) s_p[warp][r][key] = p;
#pragma unroll
      for (int j = 0; j < OUT_DIMS; ++j) acc[r][j] *= alpha;
    }
    __syncwarp();

    for (int t = 0; t < TILE_KEYS; ++t) {
#pragma unroll
      for (int j = 0; j < OUT_DIMS; ++j) {
        const int d = lane + j * kWarpSize;
        if (HEAD_SIZE % kWarpSize == 0 || d < HEAD_SIZE) {
          const float v = s_v[t][d];
#pragma unroll
          for (int r = 0; r < kRowsPerWarp; ++r) acc[r][j] += s_p[warp][r][t] * v;
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (q_pos[r] < 0) continue;
    const int row = tile_row + warp * kRowsPerWarp + r;
    const int head = kv_head * group + row % group;
    T* o = out + ((long long)(first_row + row / group) * num_heads + head) * HEAD_SIZE;
    float inv_sum = 1.f / l_run[r];
    if (sinks != nullptr) {  // one more key, of zero value: in the sum, not in acc
      const float m = fmaxf(m_run[r], sinks[head]);
      const float alpha = __expf(m_run[r] - m);
      inv_sum = alpha / (l_run[r] * alpha + __expf(sinks[head] - m));
    }
#pragma unroll
    for (int j = 0; j < OUT_DIMS; ++j) {
      const int d = lane + j * kWarpSize;
      if (HEAD_SIZE % kWarpSize == 0 || d < HEAD_SIZE) o[d] = from_float<T>(acc[r][j] * inv_sum);
    }
  }
}

}  // namespace pagedgen

// Explicit instantiations, with the launch constants of pagedgen/kernels/prefill_attention.py.
// The runtime compiles one (scalar, cache type, head size, block size) per module and says which
// with -D; offline builds (nvcc -cubin in the tests) get every supported combination.
#define PAGEDGEN_PF_BLOCK(T, C, HEAD, BLOCK)                                                   \
  template __global__ void pagedgen::prefill_attention_kernel<T, C, HEAD, BLOCK>(             \
      T*, const T*, const C*, const C*, const int*, const int*, const int*, int, int, int,    \
      float, int, float, const float*, const float*);
#define PAGEDGEN_PF_HEAD(T, C, HEAD) \
  PAGEDGEN_PF_BLOCK(T, C, HEAD, 8)   \
  PAGEDGEN_PF_BLOCK(T, C, HEAD, 16)  \
  PAGEDGEN_PF_BLOCK(T, C, HEAD, 32)
#define PAGEDGEN_PF_CACHE(T, C) \
  PAGEDGEN_PF_HEAD(T, C, 64)    \
  PAGEDGEN_PF_HEAD(T, C, 80)    \
  PAGEDGEN_PF_HEAD(T, C, 96)    \
  PAGEDGEN_PF_HEAD(T, C, 128)   \
  PAGEDGEN_PF_HEAD(T, C, 256)
#define PAGEDGEN_PF_SCALAR(T)                \
  PAGEDGEN_PF_CACHE(T, T)                    \
  PAGEDGEN_PF_CACHE(T, pagedgen::fp8_e4m3)   \
  PAGEDGEN_PF_CACHE(T, pagedgen::fp8_e5m2)

#if defined(PAGEDGEN_SCALAR_T)
PAGEDGEN_PF_BLOCK(PAGEDGEN_SCALAR_T, PAGEDGEN_CACHE_T, PAGEDGEN_HEAD_SIZE, PAGEDGEN_BLOCK_SIZE)
#else
PAGEDGEN_PF_SCALAR(float)
PAGEDGEN_PF_SCALAR(__half)
PAGEDGEN_PF_SCALAR(__nv_bfloat16)
#endif
