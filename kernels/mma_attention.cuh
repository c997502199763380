// The warp-level steps of the tensor-core attention kernels (decode_attend_mma.cuh,
// prefill_attention_mma.cu): a warp holds 16 query rows as the A rows of mma.sync.m16n8k16
// (mma.cuh), and K/V tiles in shared memory (kv_tiles.cuh); lane = 4 group + quad holds rows
// group and group + 8 of every accumulator: s[n][0..1] and s[n][2..3] of n-tile n.
#pragma once

#include "common.cuh"
#include "kv_tiles.cuh"
#include "mma.cuh"

namespace pagedgen {

// The A fragment of rows row0 ... row0 + 15, k-step ks, of a swizzled tile of ROW pieces a row:
// ldmatrix matrix j is rows (j % 2) * 8 ..., columns 16 ks + (j / 2) * 8 ...
template <int ROW>
__device__ __forceinline__ void load_a_fragment(unsigned (&a)[4], const Piece* tile, int row0,
                                                int ks) {
  const int lane = threadIdx.x % kWarpSize;
  const int j = lane / 8;
  ldmatrix_x4(a, &tile[swizzled_piece<ROW>(row0 + j % 2 * 8 + lane % 8, 2 * ks + j / 2)]);
}

// s[n] = Q K^T of the warp's rows and keys key0 + 8 n ... of s_k, NT n-tiles; Q's fragments are
// qa[ks] or, without Q_IN_REGISTERS (heads of 256, whose outputs take the registers), reloaded
// from rows q_row0 ... of s_q. K's ldmatrix matrix j is keys (j / 2) * 8 ... of a pair of
// n-tiles, dims 16 ks + (j % 2) * 8 ...
template <typename T, int HEAD_SIZE, int NT, bool Q_IN_REGISTERS>
__device__ __forceinline__ void mma_scores(float (&s)[NT][4],
                                           unsigned (&qa)[Q_IN_REGISTERS ? HEAD_SIZE / 16 : 1][4],
                                           const Piece* s_q, int q_row0, const Piece* s_k,
                                           int key0) {
  constexpr int kRow = HEAD_SIZE / 8;
  const int lane = threadIdx.x % kWarpSize;
  const int j = lane / 8;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) s[n][i] = 0.f;
  }
#pragma unroll
  for (int ks = 0; ks < HEAD_SIZE / 16; ++ks) {
    if constexpr (!Q_IN_REGISTERS) load_a_fragment<kRow>(qa[0], s_q, q_row0, ks);
    const unsigned(&a)[4] = qa[Q_IN_REGISTERS ? ks : 0];
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      unsigned b[4];
      ldmatrix_x4(b, &s_k[swizzled_piece<kRow>(key0 + np * 16 + j / 2 * 8 + lane % 8,
                                               2 * ks + j % 2)]);
      mma_16816<T>(s[2 * np], a, b[0], b[1]);
      mma_16816<T>(s[2 * np + 1], a, b[2], b[3]);
    }
  }
}

// One step of the online softmax over the warp's scores s (masked ones kNegMax): the running max
// m and this lane's share l of the row sums, and the output o, rescale by exp(m_old - m_new);
// s becomes the weights p, 0 where masked (also while a row has seen nothing, m = kNegMax).
template <int NT, int DT>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&m)[2], float (&l)[2],
                                               float (&o)[DT][4]) {
  float row_max[2] = {kNegMax, kNegMax};
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) row_max[i / 2] = fmaxf(row_max[i / 2], s[n][i]);
  }
  float alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(kFullMask, row_max[r], 1));
    row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(kFullMask, row_max[r], 2));
    const float m_new = fmaxf(m[r], row_max[r]);
    alpha[r] = __expf(m[r] - m_new);
    m[r] = m_new;
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[n][i] = s[n][i] == kNegMax ? 0.f : __expf(s[n][i] - m[i / 2]);
      l[i / 2] += s[n][i];
    }
  }
#pragma unroll
  for (int d = 0; d < DT; ++d) {
#pragma unroll
    for (int i = 0; i < 4; ++i) o[d][i] *= alpha[i / 2];
  }
}

// o += p V over keys key0 ... key0 + 8 NT - 1 of s_v. P's A fragment of keys 16 ks ... is the
// accumulators of n-tiles 2 ks and 2 ks + 1; V's transposed matrix j is keys (j % 2) * 8 ...,
// dims 16 dn + (j / 2) * 8 ...: B fragments of dim n-tiles 2 dn and 2 dn + 1.
template <typename T, int HEAD_SIZE, int NT>
__device__ __forceinline__ void mma_pv(float (&o)[HEAD_SIZE / 8][4], const float (&p)[NT][4],
                                       const Piece* s_v, int key0) {
  constexpr int kRow = HEAD_SIZE / 8;
  const int lane = threadIdx.x % kWarpSize;
  const int j = lane / 8;
#pragma unroll
  for (int ks = 0; ks < NT / 2; ++ks) {
    const unsigned pa[4] = {pack2<T>(p[2 * ks][0], p[2 * ks][1]),
                            pack2<T>(p[2 * ks][2], p[2 * ks][3]),
                            pack2<T>(p[2 * ks + 1][0], p[2 * ks + 1][1]),
                            pack2<T>(p[2 * ks + 1][2], p[2 * ks + 1][3])};
#pragma unroll
    for (int dn = 0; dn < HEAD_SIZE / 16; ++dn) {
      unsigned b[4];
      ldmatrix_x4_trans(b, &s_v[swizzled_piece<kRow>(key0 + ks * 16 + j % 2 * 8 + lane % 8,
                                                     2 * dn + j / 2)]);
      mma_16816<T>(o[2 * dn], pa, b[0], b[1]);
      mma_16816<T>(o[2 * dn + 1], pa, b[2], b[3]);
    }
  }
}

}  // namespace pagedgen
