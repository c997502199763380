// Prefill and chunked-prefill attention on tensor cores (sm_80 and newer): the semantics, cache
// layout, arguments and GQA row packing of prefill_attention.cu (causal over the cached context,
// window, soft cap, sinks, ALiBi), for 16-bit caches of the activations' dtype, FlashAttention-2
// style. One thread block per (kv head, tile of kPrefillMmaRows packed rows, sequence); warp w owns
// rows 16 w ... 16 w + 15 of the tile as the A rows of mma.sync.m16n8k16, S = Q K^T and O += P V,
// with an online softmax per row, while cp.async streams the next tile of K/V keys into shared
// memory (kv_tiles.cuh).
#include "common.cuh"
#include "prefill_tile.cuh"
#include "kv_tiles.cuh"
#include "mma.cuh"
#include "mma_attention.cuh"

namespace pagedgen {

constexpr int kPrefillMmaWarps = 4;
constexpr int kPrefillMmaThreads = kPrefillMmaWarps * kWarpSize;
constexpr int kPrefillMmaRows = kPrefillMmaWarps * 16;  // BLOCK_M

// Shared memory: the Q tile [kPrefillMmaRows][ROW], then K and V, each [kStages][kTileKeys][ROW]
// (swizzled pieces). pagedgen/kernels/prefill_attention_mma.py computes kSharedBytes the same way.
template <int HEAD_SIZE>
struct PrefillMmaLayout {
  static constexpr int kRow = HEAD_SIZE / 8;
  static constexpr int kTileKeys = HEAD_SIZE > 128 ? 32 : 64;  // BLOCK_N
  static constexpr int kStages = 2;
  static constexpr int kQBytes = kPrefillMmaRows * HEAD_SIZE * 2;
  static constexpr int kStageBytes = kTileKeys * HEAD_SIZE * 2;  // K or V
  static constexpr int kSharedBytes = kQBytes + 2 * kStages * kStageBytes;
};

// The blocks an SM holds at kSharedBytes (an H100 has 228 KB), which __launch_bounds__ budgets
// registers for; heads of 64 would fit 5, but at the 102 registers that leaves their scores spill.
template <int HEAD_SIZE>
constexpr int kPrefillMmaMinBlocks = HEAD_SIZE <= 64 ? 3 : 2;

// grid (num_kv_heads, ceil(max_query_len * group / kPrefillMmaRows), num_seqs), block
// kPrefillMmaThreads, dynamic shared memory PrefillMmaLayout<HEAD_SIZE>::kSharedBytes
template <typename T, int HEAD_SIZE, int BLOCK_SIZE>
__global__ void __launch_bounds__(kPrefillMmaThreads, kPrefillMmaMinBlocks<HEAD_SIZE>)
    prefill_attention_mma_kernel(
        T* __restrict__ out,                   // [num_tokens, num_kv_heads * group, HEAD_SIZE]
        const T* __restrict__ query,           // [num_tokens, num_kv_heads * group, HEAD], strided
        const T* __restrict__ key_cache,       // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD]
        const T* __restrict__ value_cache,     // [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD]
        const int* __restrict__ block_tables,  // [num_seqs, max_num_blocks_per_seq]
        const int* __restrict__ cu_seqlens_q,  // [num_seqs + 1], rows of query and out
        const int* __restrict__ context_lens,  // [num_seqs]
        int max_num_blocks_per_seq, int q_stride, int group, float scale,
        int window,                              // 0: none
        float softcap,                           // 0: none
        const float* __restrict__ sinks,         // [num_heads] or nullptr: a logit in each softmax
        const float* __restrict__ alibi_slopes) {  // [num_heads] or nullptr: ALiBi's
  using L = PrefillMmaLayout<HEAD_SIZE>;
  constexpr int kTileKeys = L::kTileKeys;
  constexpr int kStages = L::kStages;
  constexpr int kKSteps = HEAD_SIZE / 16;
  constexpr int kNTiles = kTileKeys / 8;
  constexpr bool kQInRegisters = HEAD_SIZE <= 128;  // else with the output's they would spill

  const PrefillTile tile = prefill_tile<kPrefillMmaRows>(cu_seqlens_q, context_lens, block_tables,
                                                  max_num_blocks_per_seq, group, window);
  if (tile.num_rows <= 0) return;  // the whole thread block leaves together
  const int kv_head = tile.kv_head, num_heads = tile.num_heads, first_row = tile.first_row;
  const int tile_row = tile.tile_row, num_rows = tile.num_rows, first_pos = tile.first_pos;
  const int kv_begin = tile.kv_begin, kv_end = tile.kv_end;
  const int* block_table = tile.block_table;
  const int num_kv_heads = gridDim.x;

  PAGEDGEN_DYNAMIC_SHARED(smem, L::kSharedBytes);
  T* s_q = reinterpret_cast<T*>(smem);
  Piece* s_k = reinterpret_cast<Piece*>(smem + L::kQBytes);
  Piece* s_v = s_k + kStages * kTileKeys * L::kRow;

  const int tid = threadIdx.x;
  const int warp = tid / kWarpSize;
  const int lane = tid % kWarpSize;
  const int group_id = lane / 4;
  const int quad = lane % 4;

  // Tiles start on a multiple of kTileKeys, so on a KV block boundary; a tile's blocks are read
  // a tile ahead.
  const KvTileLoader<T, HEAD_SIZE, BLOCK_SIZE, kTileKeys, kPrefillMmaThreads> loader(
      key_cache, value_cache, block_table, kv_head, num_kv_heads);
  const int first_key = kv_begin / kTileKeys * kTileKeys;
  const int num_tiles = (kv_end - first_key + kTileKeys - 1) / kTileKeys;
  auto tile_blocks = [&](int t) { return loader.blocks(first_key + t * kTileKeys, kv_end); };
  auto load_tile = [&](int t, int blocks) {
    if (t < num_tiles) {
      loader.load(s_k, s_v, t % kStages * kTileKeys, first_key + t * kTileKeys, kv_begin, kv_end,
                  blocks);
    }
    cp_async_commit();  // empty past the last tile: every iteration's wait counts the same
  };
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) load_tile(t, tile_blocks(t));
  int next_blocks = tile_blocks(kStages - 1);

  for (int i = tid; i < kPrefillMmaRows * HEAD_SIZE; i += kPrefillMmaThreads) {
    const int m = i / HEAD_SIZE;
    const int d = i % HEAD_SIZE;
    T q = from_float<T>(0.f);
    if (m < num_rows) {
      const int row = tile_row + m;
      const int head = kv_head * group + row % group;
      q = query[(long long)(first_row + row / group) * q_stride + head * HEAD_SIZE + d];
    }
    s_q[swizzled_piece<L::kRow>(m, d / 8) * 8 + d % 8] = q;
  }
  __syncthreads();
  const Piece* q_tile = reinterpret_cast<const Piece*>(s_q);
  unsigned qa[kQInRegisters ? kKSteps : 1][4];
  if constexpr (kQInRegisters) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) load_a_fragment<L::kRow>(qa[ks], q_tile, warp * 16, ks);
  }

  // This lane's rows: group_id and group_id + 8 of the warp's 16.
  int q_pos[2];     // -1: a row past the tile's end, which sees nothing
  float slope[2];   // ALiBi's, 0 without
  int head_of[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int m = warp * 16 + group_id + 8 * r;
    const int row = tile_row + m;
    q_pos[r] = m < num_rows ? first_pos + row / group : -1;
    head_of[r] = kv_head * group + row % group;
    slope[r] = m < num_rows && alibi_slopes != nullptr ? alibi_slopes[head_of[r]] : 0.f;
  }
  // The positions the warp's rows span; a warp whose rows see none of a tile skips it.
  const int warp_rows = min(16, num_rows - warp * 16);
  const int warp_first_pos = first_pos + (tile_row + warp * 16) / group;
  const int warp_last_pos = first_pos + (tile_row + warp * 16 + warp_rows - 1) / group;

  float o[HEAD_SIZE / 8][4] = {};
  float m_run[2] = {kNegMax, kNegMax};
  float l_run[2] = {0.f, 0.f};  // this lane's share of the row sums
  for (int t = 0; t < num_tiles; ++t) {
    cp_async_wait<kStages - 2>();  // this thread's copies of tile t have landed
    __syncthreads();               // everyone's have, and tile t - 1's stage is read: refill it
    load_tile(t + kStages - 1, next_blocks);
    next_blocks = tile_blocks(t + kStages);
    const int tile_key = first_key + t * kTileKeys;
    const bool seen = warp_rows > 0 && tile_key <= warp_last_pos &&
                      (window <= 0 || tile_key + kTileKeys - 1 > warp_first_pos - window);
    if (!seen) continue;  // warp-uniform
    const int stage_row = t % kStages * kTileKeys;

    // S (16 rows x kTileKeys keys) as kNTiles n-tiles of 8 keys.
    float s[kNTiles][4];
    mma_scores<T, HEAD_SIZE, kNTiles, kQInRegisters>(s, qa, q_tile, warp * 16, s_k, stage_row);
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = i / 2;
        const int key = tile_key + n * 8 + 2 * quad + i % 2;
        float score = s[n][i] * scale;
        if (softcap > 0.f) score = softcap * tanhf(score / softcap);
        score += slope[r] * (float)(key - q_pos[r]);
        // Masked keys may be zeros of an unloaded slot, never read as data.
        const bool visible = key <= q_pos[r] && (window <= 0 || key > q_pos[r] - window);
        s[n][i] = visible ? score : kNegMax;
      }
    }
    online_softmax(s, m_run, l_run, o);  // a row that has seen nothing keeps m = kNegMax
    mma_pv<T, HEAD_SIZE>(o, s, s_v, stage_row);
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(kFullMask, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(kFullMask, l_run[r], 2);
    if (q_pos[r] < 0) continue;
    const int row = tile_row + warp * 16 + group_id + 8 * r;
    const int head = head_of[r];
    float inv_sum = 1.f / l_run[r];
    if (sinks != nullptr) {  // one more key, of zero value: in the sum, not in o
      const float m = fmaxf(m_run[r], sinks[head]);
      const float a = __expf(m_run[r] - m);
      inv_sum = a / (l_run[r] * a + __expf(sinks[head] - m));
    }
    T* dst = out + ((long long)(first_row + row / group) * num_heads + head) * HEAD_SIZE;
#pragma unroll
    for (int d = 0; d < HEAD_SIZE / 8; ++d) {
      *reinterpret_cast<unsigned*>(&dst[d * 8 + 2 * quad]) =
          pack2<T>(o[d][2 * r] * inv_sum, o[d][2 * r + 1] * inv_sum);
    }
  }
}

}  // namespace pagedgen

// Explicit instantiations, as pagedgen/kernels/prefill_attention_mma.py names them. The runtime
// compiles one (scalar, head size, block size) per module and says which with -D; offline builds
// (nvcc -cubin in the tests) get every supported combination.
#define PAGEDGEN_PFM_BLOCK(T, HEAD, BLOCK)                                                      \
  template __global__ void pagedgen::prefill_attention_mma_kernel<T, HEAD, BLOCK>(             \
      T*, const T*, const T*, const T*, const int*, const int*, const int*, int, int, int,    \
      float, int, float, const float*, const float*);
#define PAGEDGEN_PFM_HEAD(T, HEAD) \
  PAGEDGEN_PFM_BLOCK(T, HEAD, 8)   \
  PAGEDGEN_PFM_BLOCK(T, HEAD, 16)  \
  PAGEDGEN_PFM_BLOCK(T, HEAD, 32)
#define PAGEDGEN_PFM_SCALAR(T) \
  PAGEDGEN_PFM_HEAD(T, 64)     \
  PAGEDGEN_PFM_HEAD(T, 128)    \
  PAGEDGEN_PFM_HEAD(T, 256)

#if defined(PAGEDGEN_SCALAR_T)
PAGEDGEN_PFM_BLOCK(PAGEDGEN_SCALAR_T, PAGEDGEN_HEAD_SIZE, PAGEDGEN_BLOCK_SIZE)
#else
PAGEDGEN_PFM_SCALAR(__half)
PAGEDGEN_PFM_SCALAR(__nv_bfloat16)
#endif
