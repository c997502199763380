// Paged prefill attention for the CPU: the query rows of each prompt (or prompt chunk) attend
// causally to their sequence's context in the paged cache, this step's K/V written already.
// Where paged_attention_cpu.c takes one query row at a time (a decode row), this kernel takes a
// tile of QT query positions times the GQA group of a kv head, so each K and V row loaded
// serves every row of the tile:
//
//   gather   the context's K rows transposed, Kt[d][t], and its V rows, Vw[t][d], widened to
//            float32 once per (sequence, kv head) for all its tiles (extended as tiles advance);
//   scores   S = Q Kt, a register block of RB rows x KB keys per pass over d (one broadcast and
//            two vector FMAs per row and d);
//   softmax  per row over its causal range (its window's, with a sliding window), soft cap,
//            ALiBi and sink as the decode kernel's (attention_scores_cpu.h); probabilities out of a
//            row's range are zeroed, as the tile's rows share one key range;
//   output   O = P Vw, RB rows x JT vectors of head_dim a pass over the keys.
//
// Cache layout and dtypes as paged_attention_cpu.c's (f32, bf16, f16, E4M3, E5M2; q and out
// float32 or bfloat16). Rows t of a context below the first position any of its queries sees
// (with a sliding window) are never read: their blocks may be freed. Scores and sums float32.
//
// A row's result does not depend on the rows beside it (batch, tile, register block, cached
// prefix): every row's sums run in one order (fma_vf), so a prompt continued after cached
// blocks gives the bits the whole prompt gives.
//
// Work: tiles (sequence, kv head, QT positions) in that order, split into contiguous runs of
// about equal cost (rows x keys), one per OpenMP thread; a thread's consecutive tiles of one
// (sequence, kv head) share its gathered K/V.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attention_scores_cpu.h"
#include "cpu_math.h"
#include "cpu_vec.h"

#define MAX_THREADS 256
#define MAX_GROUP 128
#define QT 16       // query positions a tile
#define RB 6        // rows a register block
#define KB (2 * VW) // keys a register block of the scores
#if VW == 16
#define JT 4  // vectors of head_dim a register block of the output: RB x JT accumulators
#else
#define JT 2
#endif

// c + a * b, one fused multiply-add where the target has it: an intrinsic, which the compiler
// neither reassociates nor leaves unfused for some rows of a block and not others (it did, with
// the plain expression), so every row's sums run alike.
static inline vf fma_vf(vf a, float b, vf c) {
#if VW == 16 && defined(__AVX512F__)
  return (vf)_mm512_fmadd_ps((__m512)a, _mm512_set1_ps(b), (__m512)c);
#elif VW == 8 && defined(__FMA__)
  return (vf)_mm256_fmadd_ps((__m256)a, _mm256_set1_ps(b), (__m256)c);
#else
  return c + a * b;
#endif
}

typedef struct {
  void *out;           // [num_tokens, num_heads, head_dim], contiguous
  const void *query;   // [num_tokens, num_heads, head_dim], rows query_row_stride apart
  const void *key_cache;
  const void *value_cache;
  const int32_t *block_tables;  // [num_seqs, block_table_stride]
  const int32_t *query_starts;  // [num_seqs]: sequence s's rows are query_starts[s] ..
  const int32_t *query_lens;    // [num_seqs]   .. + query_lens[s],
  const int32_t *context_lens;  // [num_seqs]   the last positions of its context
  int64_t query_row_stride, block_table_stride;
  int num_heads, num_kv_heads, head_dim, block_size, kv_dtype, act_bf16;
  float scale;
  int sliding_window;  // 0: the whole context
  float softcap;       // 0: none
  const float *sinks;  // [num_heads] or NULL
  const float *alibi_slopes;  // [num_heads] or NULL
} Prefill;

typedef struct {
  int32_t seq, kv_head, p0, p1;  // query positions p0 .. p1 - 1
} Tile;

// What one thread holds for the (sequence, kv head) its tiles are in.
typedef struct {
  int32_t seq, kv_head;
  int lo, hi;       // positions lo .. hi - 1 gathered, column c holding position lo + c
  int64_t ldk;      // Kt's row length (keys), a multiple of KB
  int dp;           // Vw's row length: head_dim rounded up to VW
  float *kt, *vw, *s, *q;
} Scratch;

static inline int first_query(const Prefill *w, int64_t seq) {
  return w->context_lens[seq] - w->query_lens[seq];
}

// The first position a query at p sees.
static inline int window_lo(const Prefill *w, int p) {
  return w->sliding_window > 0 && p + 1 > w->sliding_window ? p + 1 - w->sliding_window : 0;
}

// Rows lo .. hi - 1 of the context into Kt (transposed) and Vw, widened to float32.
#define GATHER(KV)                                                                        \
  static void gather_##KV(const Prefill *w, Scratch *x, int lo, int hi) {                \
    const int64_t row_stride = (int64_t)w->num_kv_heads * w->head_dim;                    \
    const int32_t *table = w->block_tables + (int64_t)x->seq * w->block_table_stride;     \
    const KV##_t *kc = (const KV##_t *)w->key_cache, *vc = (const KV##_t *)w->value_cache; \
    for (int t = lo; t < hi; t++) {                                                       \
      const int64_t at = ((int64_t)table[t / w->block_size] * w->block_size +             \
                          t % w->block_size) * row_stride + (int64_t)x->kv_head * w->head_dim; \
      const int c = t - x->lo;                                                          \
      float *v = x->vw + (int64_t)c * x->dp;                                              \
      for (int d = 0; d < w->head_dim; d++) {                                             \
        x->kt[d * x->ldk + c] = load_f1_##KV(kc + at + d);                                \
        v[d] = load_f1_##KV(vc + at + d);                                                 \
      }                                                                                   \
    }                                                                                     \
  }
GATHER(f32)
GATHER(bf16)
GATHER(f16)
GATHER(e4m3)
GATHER(e5m2)

static void gather(const Prefill *w, Scratch *x, int lo, int hi) {
  switch (w->kv_dtype) {
    case 0: gather_f32(w, x, lo, hi); break;
    case 1: gather_bf16(w, x, lo, hi); break;
    case 2: gather_f16(w, x, lo, hi); break;
    case 3: gather_e4m3(w, x, lo, hi); break;
    default: gather_e5m2(w, x, lo, hi); break;
  }
}

// S[r][c0 .. c0 + KB) = scale * Q[r] . Kt[:, c0 .. c0 + KB) for rows r < rows <= RB (the rest
// of the block recomputes the last row, unstored).
static inline void score_block(const float *q, int head_dim, int rows, const float *kt,
                               int64_t ldk, int c0, float scale, float *s, int64_t lds) {
  vf acc[RB][2];
  for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] = (vf){0};
  for (int d = 0; d < head_dim; d++) {
    const vf k0 = load_vf_f32(kt + d * ldk + c0), k1 = load_vf_f32(kt + d * ldk + c0 + VW);
    for (int r = 0; r < RB; r++) {
      const float qd = q[(r < rows ? r : rows - 1) * head_dim + d];
      acc[r][0] = fma_vf(k0, qd, acc[r][0]);
      acc[r][1] = fma_vf(k1, qd, acc[r][1]);
    }
  }
  for (int r = 0; r < rows; r++) {
    store_vf(s + r * lds + c0, acc[r][0] * scale);
    store_vf(s + r * lds + c0 + VW, acc[r][1] * scale);
  }
}

// out[r] = (P[r] Vw) * inv_sum[r] for rows r0 .. r0 + rows, keys c_lo .. c_hi, JT vectors of
// head_dim from j0 (jt of them valid).
static inline void output_block(const Scratch *x, int r0, int rows, int c_lo, int c_hi,
                                int64_t lds, int j0, int jt, float *o) {
  vf acc[RB][JT];
  for (int r = 0; r < RB; r++)
    for (int j = 0; j < JT; j++) acc[r][j] = (vf){0};
  const float *p[RB];
  for (int r = 0; r < RB; r++) p[r] = x->s + (int64_t)(r0 + (r < rows ? r : rows - 1)) * lds;
  for (int c = c_lo; c < c_hi; c++) {
    const float *v = x->vw + (int64_t)c * x->dp + j0 * VW;
    vf y[JT];
    for (int j = 0; j < JT; j++) y[j] = j < jt ? load_vf_f32(v + j * VW) : (vf){0};
    for (int r = 0; r < RB; r++) {
      const float pc = p[r][c];
      for (int j = 0; j < JT; j++) acc[r][j] = fma_vf(y[j], pc, acc[r][j]);
    }
  }
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < jt; j++) store_vf(o + (int64_t)r * x->dp + (j0 + j) * VW, acc[r][j]);
}

static void attend_tile(const Prefill *w, Scratch *x, const Tile *tile, float *o) {
  const int head_dim = w->head_dim, group = w->num_heads / w->num_kv_heads;
  const int first = first_query(w, tile->seq);
  const int64_t row0 = w->query_starts[tile->seq] + (tile->p0 - first);
  const int rows = (tile->p1 - tile->p0) * group;  // row r: position p0 + r / group, head r % group
  const int64_t lds = x->ldk;
  // the query rows, widened
  for (int r = 0; r < rows; r++) {
    const int64_t at = (row0 + r / group) * w->query_row_stride +
                       (int64_t)(tile->kv_head * group + r % group) * head_dim;
    float *q = x->q + (int64_t)r * head_dim;
    if (w->act_bf16)
      for (int d = 0; d < head_dim; d++) q[d] = load_f1_bf16((const bf16_t *)w->query + at + d);
    else
      memcpy(q, (const float *)w->query + at, sizeof(float) * (size_t)head_dim);
  }
  // keys lo .. p1 - 1 reach some row of the tile: scores from c_lo, rounded down to KB
  const int c_lo = window_lo(w, tile->p0) - x->lo, c_hi = tile->p1 - x->lo;
  for (int c0 = c_lo / KB * KB; c0 < c_hi; c0 += KB)
    for (int r0 = 0; r0 < rows; r0 += RB)
      score_block(x->q + (int64_t)r0 * head_dim, head_dim, rows - r0 < RB ? rows - r0 : RB,
                  x->kt, x->ldk, c0, w->scale, x->s + r0 * lds, lds);
  // each row's softmax over its own range; zeros elsewhere in c_lo .. c_hi
  float inv_sum[QT * MAX_GROUP];
  for (int r = 0; r < rows; r++) {
    const int p = tile->p0 + r / group;
    const int a = window_lo(w, p) - x->lo, b = p + 1 - x->lo;
    float *s = x->s + r * lds;
    const int h = tile->kv_head * group + r % group;
    const float *sink = w->sinks == NULL ? NULL : w->sinks + h;
    const float *alibi = w->alibi_slopes == NULL ? NULL : w->alibi_slopes + h;
    softmax_rows(w->softcap, sink, alibi, s + a, 1, b - a, inv_sum + r);
    for (int c = c_lo; c < a; c++) s[c] = 0.0f;
    for (int c = b; c < c_hi; c++) s[c] = 0.0f;
  }
  for (int r0 = 0; r0 < rows; r0 += RB) {
    const int n = rows - r0 < RB ? rows - r0 : RB;
    for (int j0 = 0; j0 < x->dp / VW; j0 += JT) {
      const int jt = x->dp / VW - j0 < JT ? x->dp / VW - j0 : JT;
      output_block(x, r0, n, c_lo, c_hi, lds, j0, jt, o + (int64_t)r0 * x->dp);
    }
  }
  // out, each row scaled by its 1 / sum (rounded to bfloat16 where out is)
  for (int r = 0; r < rows; r++) {
    const int64_t at = ((row0 + r / group) * w->num_heads + tile->kv_head * group + r % group) *
                       (int64_t)head_dim;
    const float *src = o + (int64_t)r * x->dp;
    if (w->act_bf16) {
      bf16_t *dst = (bf16_t *)w->out + at;
      for (int d = 0; d < head_dim; d++) dst[d] = float_to_bf16(src[d] * inv_sum[r]);
    } else {
      float *dst = (float *)w->out + at;
      for (int d = 0; d < head_dim; d++) dst[d] = src[d] * inv_sum[r];
    }
  }
}

// The positions a (sequence, kv head)'s gathered K/V starts at: its first query's window.
static inline int context_lo(const Prefill *w, int64_t seq) {
  return window_lo(w, first_query(w, seq));
}

static int run_tiles(const Prefill *w, const Tile *tiles, int64_t begin, int64_t end) {
  if (begin >= end) return 0;
  const int group = w->num_heads / w->num_kv_heads;
  int max_span = 0;
  for (int64_t i = begin; i < end; i++) {
    const int span = tiles[i].p1 - context_lo(w, tiles[i].seq);
    max_span = span > max_span ? span : max_span;
  }
  Scratch x = {.seq = -1, .kv_head = -1};
  x.ldk = (max_span + KB - 1) / KB * KB + KB;
  x.dp = (w->head_dim + VW - 1) / VW * VW;
  const size_t kt = (size_t)w->head_dim * x.ldk, vw = (size_t)x.ldk * x.dp;
  const size_t s = (size_t)QT * group * x.ldk, q = (size_t)QT * group * w->head_dim;
  const size_t o = (size_t)QT * group * x.dp;
  float *all = (float *)calloc(kt + vw + s + q + o, sizeof(float));
  if (all == NULL) return 1;
  x.kt = all, x.vw = all + kt, x.s = x.vw + vw, x.q = x.s + s;
  float *out = x.q + q;
  for (int64_t i = begin; i < end; i++) {
    const Tile *t = &tiles[i];
    if (t->seq != x.seq || t->kv_head != x.kv_head) {
      x.seq = t->seq, x.kv_head = t->kv_head;
      x.lo = x.hi = context_lo(w, t->seq);
    }
    if (t->p1 > x.hi) {
      gather(w, &x, x.hi, t->p1);
      x.hi = t->p1;
    }
    attend_tile(w, &x, t, out);
  }
  free(all);
  return 0;
}

// Returns 0 on success, 1 on a bad argument or a failed allocation.
int paged_attention_prefill(int kv_dtype, int act_bf16, void *out, const void *query,
                            int64_t query_row_stride, const void *key_cache,
                            const void *value_cache, const int32_t *block_tables,
                            int64_t block_table_stride, const int32_t *query_starts,
                            const int32_t *query_lens, const int32_t *context_lens,
                            int64_t num_seqs, int num_heads,
                            int num_kv_heads, int head_dim, int block_size, float scale,
                            int sliding_window, float softcap, const float *sinks,
                            const float *alibi_slopes, int num_threads) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || num_heads / num_kv_heads > MAX_GROUP)
    return 1;
  if (kv_dtype < 0 || kv_dtype > 4 || head_dim <= 0) return 1;
#ifndef HAVE_FLOAT16
  if (kv_dtype == 2) return 1;
#endif
  const Prefill w = {out,          query,          key_cache,        value_cache,
                     block_tables, query_starts,   query_lens,       context_lens,
                     query_row_stride,
                     block_table_stride, num_heads, num_kv_heads,    head_dim,
                     block_size,   kv_dtype,       act_bf16,         scale,
                     sliding_window, softcap,      sinks,            alibi_slopes};
  int64_t num_tiles = 0;
  for (int64_t s = 0; s < num_seqs; s++) {
    num_tiles += (int64_t)num_kv_heads * ((query_lens[s] + QT - 1) / QT);
  }
  Tile *tiles = (Tile *)malloc(sizeof(Tile) * (size_t)(num_tiles > 0 ? num_tiles : 1));
  double *cost = (double *)malloc(sizeof(double) * (size_t)(num_tiles + 1));
  if (tiles == NULL || cost == NULL) {
    free(tiles), free(cost);
    return 1;
  }
  int64_t n = 0;
  cost[0] = 0.0;
  for (int64_t s = 0; s < num_seqs; s++) {
    const int first = first_query(&w, s), end = context_lens[s];
    for (int h = 0; h < num_kv_heads; h++)
      for (int p = first; p < end; p += QT) {
        const int p1 = p + QT < end ? p + QT : end;
        tiles[n] = (Tile){(int32_t)s, h, p, p1};
        cost[n + 1] = cost[n] + (double)(p1 - p) * (p1 - window_lo(&w, p) + KB);
        n++;
      }
  }
  if (num_threads < 1) num_threads = 1;
  if (num_threads > MAX_THREADS) num_threads = MAX_THREADS;
  if (num_threads > n) num_threads = n > 0 ? (int)n : 1;
  int64_t bounds[MAX_THREADS + 1];
  bounds[0] = 0;
  for (int i = 1, at = 0; i <= num_threads; i++) {
    const double target = cost[n] * i / num_threads;
    while (at < n && (cost[at] < target || i == num_threads)) at++;
    bounds[i] = at;
  }
  int status = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(num_threads) reduction(| : status)
  for (int i = omp_get_thread_num(); i < num_threads; i += omp_get_num_threads())
    status |= run_tiles(&w, tiles, bounds[i], bounds[i + 1]);
#else
  for (int i = 0; i < num_threads; i++) status |= run_tiles(&w, tiles, bounds[i], bounds[i + 1]);
#endif
  free(tiles), free(cost);
  return status;
}
