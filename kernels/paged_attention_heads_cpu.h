#pragma once
// The decode kernel's sequence-major pass (paged_attention_cpu.c inlines this file after its
// unit pass, whose Work, Unit, FOR_EACH_BLOCK and q . k steps it uses): kv heads h0 .. h1 of one
// sequence at once, block by block. A cache row holds every kv head's K (or V) side by side, so
// the unit pass, one kv head at a time, reads head_dim of every row_stride elements: a stride
// the hardware prefetchers do not follow, and at long contexts (a sequence's rows no longer fit
// L2 while its next heads come round) each head's slice comes from memory on its own. Here each
// block's rows are read whole, in address order, once for all the heads, which the hardware
// prefetchers follow within a block. AVX-512 with avx512_bf16 and AMX, 32 sequences of 2,048
// tokens, bfloat16 caches, 8 layers: MHA heads of 64 (BLOOM) 246 -> 113 ms, 32 heads of 128 on 8
// kv heads (Llama 3 8B) 347 -> 143 ms, the unit way and this way.
//
// Blocks lie anywhere in the pool, so the passes ask for the rows of the blocks they read next
// themselves (see Stream), into L2: with a few vector ops a line, a loop over scattered blocks
// streams at ~13.5 GB/s here without it and ~20 with it (a C test); SmolLM2's heads, 32 x 2,048
// tokens: 4.30 -> 3.48 ms a layer.
//
// Per (kv head, query head of its group) row r: scores as the unit pass computes them (the same
// q . k steps, in the same order), the same softmax_rows, then the weighted sum of V rows kept in
// acc[r] (float32, in L1; in registers over a block) in position order, so a row's result does
// not depend on the heads beside it.

#define MAX_ROWS 128  // query heads a call attends at most: scores and accumulators per row
#define PF_LEAD 16384  // bytes of K/V the prefetches run ahead of the loads, a block at least

// The rows of one block a pass reads: num_rows rows of bytes each, a cache row apart.
typedef struct {
  const char *rows;
  int num_rows, bytes;
} BlockRows;

// Every block a thread reads in the order it reads them (each run's K blocks, then its V blocks),
// and the one it reads now. Blocks lie anywhere in the pool, so the hardware prefetchers cannot
// run ahead of a block table: the passes ask for the rows `lead` blocks on in this list, a part
// of a block for each part of a block they compute, so memory streams without a break across
// blocks, from the K pass to the V pass, and from one sequence to the next (asking at a pass's
// own next blocks only, each pass and each sequence began on a cold block).
typedef struct {
  BlockRows *blocks;
  int64_t num_blocks, at, lead;
  int64_t row_bytes;  // bytes from one cache row to the next
} Stream;

typedef struct {
  float *scores;  // [MAX_ROWS][max context + 1]
  float *acc;     // [MAX_ROWS][head_dim], 64-byte aligned
  void *qv;       // [MAX_ROWS][query vectors], 64-byte aligned
  uint32_t *qb;   // AMX: [heads][head_dim / 32][16 dim pairs][group] bfloat16 pairs of q
  int amx;        // 1: whole chunks of VW bfloat16 keys are scored on AMX tiles (qk_keys_amx)
  Stream stream;
} HeadsScratch;

// bfloat16 keys on AMX tiles, where the build has them (-march=native on Xeons since Sapphire
// Rapids) and Linux grants them: S^T = K Q^T for 16 keys of one kv head at a time, K's rows as
// they lie in the cache (A, 16 keys x 32 dims a tile, a cache row apart) against the group's q
// as B (16 dim pairs x group), summed in float32 as the dot-product instructions do, in another
// order. A chunk of fewer keys (a context's last block, a window's first) takes the dot-product
// instructions: a tile would read rows past the block.
#if HAVE_DPBF16 && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define HAVE_AMX_QK 1
#include "amx_tiles.h"

// Tiles 0-3: S^T (16 keys x group floats) of four kv heads in turn, so that one head's dot
// products run while the one before stores its result; 4-5, 6-7: K and q, in turn.
static void configure_qk_tiles(int group) {
  TileConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette_id = 1;
  for (int t = 0; t < 8; t++) cfg.colsb[t] = t == 4 || t == 6 ? 64 : 4 * group, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
}

// Tile dot products take immediate tile numbers: one case per (S^T tile, K and q pair).
#define QK_DP(C, A, B)                                                       \
  do {                                                                       \
    _tile_loadd(A, ka, stride);                                              \
    _tile_loadd(B, qa, 4 * group);                                           \
    _tile_dpbf16ps(C, A, B);                                                 \
  } while (0)
#define QK_STORE(C) _tile_stored(C, st + (h - 4) * 16 * group, 4 * group)

// scores[(h * group + n) * span + m] = scale * (q_{h,n} . k_{h,m}) for the 16 keys
// k_{h,m} = k + m * row_stride + h * head_dim of each of `heads` kv heads and their query heads
// n, whose bfloat16 pairs qb holds (HeadsScratch.qb's).
static inline void qk_keys_amx(const bf16_t *k, int64_t row_stride, const uint32_t *qb,
                               int heads, int head_dim, int group, float scale, float *scores,
                               int span) {
  float st[MAX_ROWS * 16] __attribute__((aligned(64)));  // [kv head][key][n]
  const int chunks = head_dim / 32;
  const int64_t stride = row_stride * 2;
  int pair = 0;
  for (int h = 0; h < heads + 4; h++) {
    if (h >= 4) switch (h % 4) {  // head h - 4's S^T, which tile h % 4 held
        case 0: QK_STORE(0); break;
        case 1: QK_STORE(1); break;
        case 2: QK_STORE(2); break;
        default: QK_STORE(3); break;
      }
    if (h >= heads) continue;
    switch (h % 4) {
      case 0: _tile_zero(0); break;
      case 1: _tile_zero(1); break;
      case 2: _tile_zero(2); break;
      default: _tile_zero(3); break;
    }
    for (int c = 0; c < chunks; c++, pair ^= 1) {
      const bf16_t *ka = k + h * head_dim + 32 * c;
      const uint32_t *qa = qb + (h * chunks + c) * 16 * group;
      switch (h % 4 * 2 + pair) {
        case 0: QK_DP(0, 4, 5); break;
        case 1: QK_DP(0, 6, 7); break;
        case 2: QK_DP(1, 4, 5); break;
        case 3: QK_DP(1, 6, 7); break;
        case 4: QK_DP(2, 4, 5); break;
        case 5: QK_DP(2, 6, 7); break;
        case 6: QK_DP(3, 4, 5); break;
        default: QK_DP(3, 6, 7); break;
      }
    }
  }
  const __m512i keys = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
      _mm512_set1_epi32(group));
  for (int h = 0; h < heads; h++)
    for (int n = 0; n < group; n++) {
      const __m512i at = _mm512_add_epi32(keys, _mm512_set1_epi32(h * 16 * group + n));
      const __m512 x = _mm512_i32gather_ps(at, st, 4);
      _mm512_storeu_ps(scores + (h * group + n) * span, _mm512_mul_ps(x, _mm512_set1_ps(scale)));
    }
}

// HeadsScratch.qb of the rows' bfloat16 query vectors (DPBF16_QSET's: head_dim in order).
static inline void set_qb(uint32_t *qb, const void *qv, int heads, int group, int head_dim) {
  const uint32_t *pairs = (const uint32_t *)qv;
  const int chunks = head_dim / 32;
  const __m512i rows = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
      _mm512_set1_epi32(group));
  for (int h = 0; h < heads; h++)
    for (int c = 0; c < chunks; c++)
      for (int n = 0; n < group; n++) {  // 16 pairs of query head n: a column of the tile
        const __m512i x = _mm512_loadu_si512(pairs + (h * group + n) * head_dim / 2 + 16 * c);
        _mm512_i32scatter_epi32(qb + (h * chunks + c) * 16 * group + n, rows, x, 4);
      }
}
#define DPBF16_AMX 1
#else
#define HAVE_AMX_QK 0
#define DPBF16_AMX 0
static inline void set_qb(uint32_t *qb, const void *qv, int heads, int group, int head_dim) {}
static inline void qk_keys_amx(const bf16_t *k, int64_t row_stride, const uint32_t *qb,
                               int heads, int head_dim, int group, float scale, float *scores,
                               int span) {}
#endif
#define WIDEN_AMX 0

// Part `part` of `parts` (by rows) of the block `lead` on into L2 (prefetcht2: into L1, they took
// fill buffers the loads of this block wait on). always_inline: GCC 12 takes a function of
// prefetches alone for one without side effects and drops its calls.
static inline __attribute__((always_inline)) void prefetch_part(const Stream *s, int part,
                                                                int parts) {
  if (s->at + s->lead >= s->num_blocks) return;
  const BlockRows *next = &s->blocks[s->at + s->lead];
  const int r1 = next->num_rows * (part + 1) / parts;  // rows <= block_size: no overflow
  for (int r = next->num_rows * part / parts; r < r1; r++) {
    const char *row = next->rows + r * s->row_bytes;
    const char *end = row + next->bytes;
    for (const char *c = (const char *)((uintptr_t)row & ~(uintptr_t)63); c < end; c += 64)
      __builtin_prefetch(c, 0, 1);
  }
}

// The query rows as the q . k steps take them: float32 vectors, or bfloat16 pairs for dpbf16.
#define WIDEN_QN(HD) ((HD) / VW)
#define WIDEN_QTYPE vf
#define WIDEN_QSET(dst, q, HD) \
  for (int j = 0; j < (HD) / VW; j++) memcpy(&(dst)[j], (q) + j * VW, sizeof(vf));
#define WIDEN_QK(KV, HD, qv, k, count, s) \
  qk_keys_##KV##_##HD(qv, k, row_stride, count, w->scale, s)
#define DPBF16_QN(HD) ((HD) / 32)
#define DPBF16_QTYPE __m512bh
#define DPBF16_QSET(dst, q, HD)                                           \
  for (int j = 0; j < (HD) / 32; j++)                                     \
    (dst)[j] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps((q) + 32 * j + 16),    \
                                   _mm512_loadu_ps((q) + 32 * j));
#define DPBF16_QK(KV, HD, qv, k, count, s) \
  qk_keys_dpbf16_##HD(qv, k, row_stride, count, w->scale, s)

// Two vectors of V from 2 VW elements, the even ones (0, 2, ..) and the odd ones, each widened
// exactly: for bfloat16 on AVX-512, one load and two bit operations where widening each half
// takes a load, a zero extension and a shift. The accumulators then hold each pair of vectors'
// elements in that order (ATTEND_HEADS puts them back in place at the end).
#if VW == 16 && defined(__AVX512F__)
#define PAIRED_bf16 1
static inline void load_pair_bf16(const bf16_t *p, vf *even, vf *odd) {
  const __m512i x = _mm512_loadu_si512(p);
  *even = (vf)_mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  *odd = (vf)_mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}
// The even and odd vectors of a pair back in element order: lo, then hi.
static inline void unpair(vf even, vf odd, vf *lo, vf *hi) {
  const __m512i l = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i h = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  *lo = (vf)_mm512_permutex2var_ps((__m512)even, l, (__m512)odd);
  *hi = (vf)_mm512_permutex2var_ps((__m512)even, h, (__m512)odd);
}
#else
#define PAIRED_bf16 0
static inline void load_pair_bf16(const bf16_t *p, vf *even, vf *odd) {}
static inline void unpair(vf even, vf odd, vf *lo, vf *hi) {}
#endif
#define PAIRED_f32 0
#define PAIRED_f16 0
#define PAIRED_e4m3 0
#define PAIRED_e5m2 0
#define load_pair_f32(p, e, o)
#define load_pair_f16(p, e, o)
#define load_pair_e4m3(p, e, o)
#define load_pair_e5m2(p, e, o)

// acc[g][j0 ..] += p[g][i] * v row i, for GT rows of accumulators (acc_stride floats apart) and
// jt <= JT vectors, over `rows` rows of one kv head in a block: the accumulators stay in
// registers over the block, each row of V loaded once for the GT query heads.
#define V_ROWS(KV)                                                                            \
  static inline __attribute__((always_inline)) void v_rows_##KV(                             \
      const KV##_t *v, int64_t row_stride, int rows, const float *const *p, int GT, int jt,   \
      float *acc, int acc_stride, int paired) {                                               \
    vf a[4][JT];                                                                              \
    for (int g = 0; g < GT; g++)                                                              \
      for (int j = 0; j < JT; j++)                                                            \
        a[g][j] = j < jt ? load_vf_f32(acc + g * acc_stride + j * VW) : (vf){0};              \
    for (int i = 0; i < rows; i++) {                                                          \
      vf x[JT];                                                                               \
      if (paired) /* jt even */                                                               \
        for (int j = 0; j < JT; j += 2)                                                       \
          if (j < jt) load_pair_##KV(v + i * row_stride + j * VW, &x[j], &x[j + 1]);          \
          else x[j] = x[j + 1] = (vf){0};                                                     \
      else                                                                                    \
        for (int j = 0; j < JT; j++)                                                          \
          x[j] = j < jt ? load_vf_##KV(v + i * row_stride + j * VW) : (vf){0};                \
      for (int g = 0; g < GT; g++) {                                                          \
        const float pt = p[g][i];                                                             \
        for (int j = 0; j < JT; j++) a[g][j] += pt * x[j];                                    \
      }                                                                                       \
    }                                                                                         \
    for (int g = 0; g < GT; g++)                                                              \
      for (int j = 0; j < jt; j++) store_vf(acc + g * acc_stride + j * VW, a[g][j]);          \
  }

#define ATTEND_HEADS(KV, HD, QK)                                                              \
  static void attend_heads_##KV##_##HD(const Work *w, int64_t seq, int h0, int h1,           \
                                       HeadsScratch *x) {                                     \
    const Unit u = unit_of(w, seq, h0);                                                       \
    const int64_t row_stride = u.row_stride;                                                  \
    const int rows = (h1 - h0) * u.group, heads = h1 - h0;                                    \
    Stream *stream = &x->stream;                                                              \
    QK##_QTYPE *qv = (QK##_QTYPE *)x->qv;                                                     \
    for (int r = 0; r < rows; r++) {                                                          \
      float q[HD];                                                                            \
      load_query(w, &u, r, q); /* the range's query heads follow each other */               \
      QK##_QSET(qv + r * QK##_QN(HD), q, HD)                                                  \
    }                                                                                         \
    if (QK##_AMX && x->amx) set_qb(x->qb, qv, heads, u.group, HD);                             \
    FOR_EACH_BLOCK(w, u, {                                                                    \
      const KV##_t *k_block = (const KV##_t *)w->key_cache +                                  \
                              (int64_t)u.block_table[b] * w->block_size * row_stride;        \
      const int parts = (n - i_begin + VW - 1) / VW * heads;                                  \
      for (int i = i_begin; i < n; i += VW) {                                                 \
        const int count = n - i < VW ? n - i : VW;                                            \
        if (QK##_AMX && x->amx && count == VW) {                                              \
          for (int h = h0; h < h1; h++)                                                       \
            prefetch_part(stream, (i - i_begin) / VW * heads + h - h0, parts);                \
          qk_keys_amx((const bf16_t *)(k_block + i * row_stride + h0 * (HD)), row_stride,     \
                      x->qb, heads, HD, u.group, w->scale, x->scores + t0 + i - u.first,      \
                      u.span);                                                                \
          continue;                                                                           \
        }                                                                                     \
        for (int h = h0; h < h1; h++) {                                                       \
          prefetch_part(stream, (i - i_begin) / VW * heads + h - h0, parts);                  \
          for (int g = 0; g < u.group; g++) {                                                 \
            const int r = (h - h0) * u.group + g;                                             \
            QK##_QK(KV, HD, qv + r * QK##_QN(HD), k_block + i * row_stride + h * (HD), count, \
                    x->scores + r * u.span + t0 + i - u.first);                               \
          }                                                                                   \
        }                                                                                     \
      }                                                                                       \
      stream->at++;                                                                           \
    })                                                                                        \
    float inv_sum[MAX_ROWS];                                                                  \
    softmax_rows(w->softcap, of_group(w, w->sinks, h0), of_group(w, w->alibi_slopes, h0),     \
                 x->scores, rows, u.span, inv_sum);                                           \
    for (int j = 0; j < rows * (HD); j++) x->acc[j] = 0.0f;                                   \
    const int paired = PAIRED_##KV && (HD) % (2 * VW) == 0;                                   \
    FOR_EACH_BLOCK(w, u, {                                                                    \
      const KV##_t *v_block = (const KV##_t *)w->value_cache +                                \
                              ((int64_t)u.block_table[b] * w->block_size + i_begin) * row_stride; \
      const int t = t0 + i_begin - u.first;                                                   \
      for (int h = h0; h < h1; h++) {                                                         \
        prefetch_part(stream, h - h0, heads);                                                 \
        for (int g0 = 0; g0 < u.group; g0 += 4) {                                             \
          const int gt = u.group - g0 < 4 ? u.group - g0 : 4;                                 \
          const int r0 = (h - h0) * u.group + g0;                                             \
          const float *p[4];                                                                  \
          for (int g = 0; g < gt; g++) p[g] = x->scores + (r0 + g) * u.span + t;              \
          for (int j0 = 0; j0 < (HD) / VW; j0 += JT) {                                        \
            const int jt = (HD) / VW - j0 < JT ? (HD) / VW - j0 : JT;                         \
            const KV##_t *v = v_block + h * (HD) + j0 * VW;                                   \
            float *acc = x->acc + r0 * (HD) + j0 * VW;                                        \
            switch (gt) { /* constant GTs: the accumulators stay in registers */              \
              case 1: v_rows_##KV(v, row_stride, n - i_begin, p, 1, jt, acc, HD, paired); break; \
              case 2: v_rows_##KV(v, row_stride, n - i_begin, p, 2, jt, acc, HD, paired); break; \
              case 3: v_rows_##KV(v, row_stride, n - i_begin, p, 3, jt, acc, HD, paired); break; \
              default: v_rows_##KV(v, row_stride, n - i_begin, p, 4, jt, acc, HD, paired); break; \
            }                                                                                 \
          }                                                                                   \
        }                                                                                     \
      }                                                                                       \
      stream->at++;                                                                           \
    })                                                                                        \
    for (int r = 0; r < rows; r++)                                                            \
      for (int j = 0; j < (HD) / VW; j += 1 + paired) {                                       \
        vf o[2] = {load_vf_f32(x->acc + r * (HD) + j * VW), (vf){0}};                         \
        if (paired) unpair(o[0], load_vf_f32(x->acc + r * (HD) + (j + 1) * VW), &o[0], &o[1]); \
        for (int m = 0; m <= paired; m++) {                                                   \
          o[m] *= inv_sum[r];                                                                 \
          store_out(w, &u, (int64_t)r * (HD) + (j + m) * VW, (const float *)&o[m], VW);       \
        }                                                                                     \
      }                                                                                       \
  }
