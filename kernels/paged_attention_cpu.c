// Paged decode attention for the CPU: one query row per sequence, K/V read through the block
// table in place, one pass over each (sequence, kv head) for all the query heads that share it
// (GQA). Two passes over the context: scores (q . k) for every token, VW keys at a time summed by
// one transpose-and-add tree, then softmax, then the weighted sum of V rows, each row loaded once
// for up to 4 query heads. q and the output are float32 or bfloat16 (widened, and rounded at
// the end), the scores and sums float32; the cache is float32, bfloat16, float16 or an 8-bit
// float (E4M3, E5M2), widened to float32 exactly as it is loaded (bfloat16 by a shift; float16
// and the 8-bit floats by the F16C conversion where the target has it). With AVX512_BF16,
// bfloat16 keys take dot-product instructions instead, over q rounded to bfloat16 (a bfloat16
// model's q already is).
// The blocks of a context lie anywhere in the pool, so the kernel prefetches them itself. Where a
// sequence has several kv heads of small groups, paged_attention_heads_cpu.h takes them together
// instead, reading each block's rows whole.
//
// Cache layout, shared with the CUDA kernels and the torch backend:
//
//   key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]   (contiguous)
//   token t of sequence s lives in block block_tables[s][t / block_size], row t % block_size
//
// Only rows t < context_len are read: a partly filled block's tail, and blocks no sequence owns,
// may hold anything (even NaN) without changing a result. With a sliding window (> 0), only
// rows context_len - sliding_window <= t are read: the blocks before the window's first block
// may have been freed (their block table entries are never read). With softcap (> 0), scores
// become softcap * tanh(scores / softcap) before the softmax (Gemma 2). With sinks (not NULL: one
// logit per query head, gpt-oss), each head's softmax also counts exp(sinks[h]) in its
// denominator, a key whose value is zero. With alibi_slopes (not NULL: one per query head, BLOOM,
// MPT), head h's score of row t gains alibi_slopes[h] * (t - (context_len - 1)).
//
// Work is split into contiguous runs of (sequence, kv head) units of about equal context length,
// one per OpenMP thread. pagedgen.kernels.cpu compiles this file on first use with -fopenmp after
// torch is loaded, so libgomp.so.1 resolves to the copy torch already runs: one thread pool for
// the matmuls and this kernel (a second pool would spin against torch's on the same cores).
// -O3 -march=native with reassociation allowed, so the reductions vectorize, but not
// -ffast-math, whose crtfastmath would turn on flush-to-zero for the whole process.

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
#define MAX_GROUP 128  // query heads per kv head (DeepSeek-V3's MLA: 128 to its one latent)
#define PF_DIST 2     // blocks ahead that K is prefetched (see prefetch_block)

typedef struct {
  void *out;           // [num_seqs, num_heads, head_dim], contiguous
  const void *query;   // [num_seqs, num_heads, head_dim], rows query_seq_stride apart
  const void *key_cache;
  const void *value_cache;
  const int32_t *block_tables;  // [num_seqs, block_table_stride]
  const int32_t *context_lens;  // [num_seqs]
  int64_t query_seq_stride;
  int64_t block_table_stride;
  int num_heads, num_kv_heads, head_dim, block_size;
  float scale;
  int sliding_window;  // 0: the whole context
  float softcap;       // 0: none
  const float *sinks;  // [num_heads] or NULL
  const float *alibi_slopes;     // [num_heads] or NULL
  int64_t unit_begin, unit_end;  // units: seq * num_kv_heads + kv_head
  int act_bf16;                   // query and out: 0 float32, 1 bfloat16
} Work;

// Where one (sequence, kv head) unit reads and writes.
typedef struct {
  int group, context_len, num_blocks, first, span;  // scores[g * span + t - first]
  int64_t row_stride, head_offset;                  // in cache elements
  const int32_t *block_table;
  int64_t q_offset, out_offset;  // elements of query and out: the group's heads, head_dim apart
} Unit;

static inline Unit unit_of(const Work *w, int64_t seq, int kv_head) {
  Unit u;
  u.group = w->num_heads / w->num_kv_heads;
  u.context_len = w->context_lens[seq];
  u.num_blocks = (u.context_len + w->block_size - 1) / w->block_size;
  u.first = w->sliding_window > 0 && u.context_len > w->sliding_window
                ? u.context_len - w->sliding_window
                : 0;
  u.span = u.context_len - u.first;
  u.row_stride = (int64_t)w->num_kv_heads * w->head_dim;
  u.head_offset = (int64_t)kv_head * w->head_dim;
  u.block_table = w->block_tables + seq * w->block_table_stride;
  u.q_offset = seq * w->query_seq_stride + (int64_t)kv_head * u.group * w->head_dim;
  u.out_offset = (seq * w->num_heads + (int64_t)kv_head * u.group) * w->head_dim;
  return u;
}

// Query head g of the unit's group as float32 (a bfloat16 query is widened exactly).
static inline void load_query(const Work *w, const Unit *u, int g, float *q) {
  const int64_t at = u->q_offset + (int64_t)g * w->head_dim;
  if (w->act_bf16) {
    const bf16_t *src = (const bf16_t *)w->query + at;
    for (int d = 0; d < w->head_dim; d++) q[d] = load_f1_bf16(src + d);
  } else {
    memcpy(q, (const float *)w->query + at, sizeof(float) * (size_t)w->head_dim);
  }
}

// Per query head values (sinks, ALiBi slopes) of kv head kv_head's group, or NULL.
static inline const float *of_group(const Work *w, const float *per_head, int kv_head) {
  return per_head == NULL ? NULL : per_head + kv_head * (w->num_heads / w->num_kv_heads);
}

// n output values from element i of the unit's output, rounded to bfloat16 where out is.
static inline void store_out(const Work *w, const Unit *u, int64_t i, const float *v, int n) {
  if (w->act_bf16) {
    bf16_t *dst = (bf16_t *)w->out + u->out_offset + i;
    for (int d = 0; d < n; d++) dst[d] = float_to_bf16(v[d]);
  } else {
    memcpy((float *)w->out + u->out_offset + i, v, sizeof(float) * (size_t)n);
  }
}

// Visits the rows t of unit u's context in block order: BODY sees b (the block's index in the
// table), t0 (its first position) and i (the row in the block, t = t0 + i).
#define FOR_EACH_BLOCK(w, u, BODY)                                                       \
  for (int b = (u).first / (w)->block_size; b < (u).num_blocks; b++) {                   \
    const int t0 = b * (w)->block_size;                                                  \
    const int n = (u).context_len - t0 < (w)->block_size ? (u).context_len - t0          \
                                                         : (w)->block_size;              \
    const int i_begin = (u).first > t0 ? (u).first - t0 : 0;                             \
    BODY                                                                                 \
  }
#define BLOCK_ROWS(w, u, cache, KV) \
  ((const KV##_t *)(cache) + (int64_t)(u).block_table[b] * (w)->block_size * (u).row_stride + \
   (u).head_offset)

// The V pass for GT query heads g0.. (heads past the group recompute the last one, unstored)
// and JT vectors of head_dim from j0: each V row is loaded (and widened) once for all GT heads.
#if VW == 16
#define JT 4  // 16 accumulators of 32 registers at GT = 4
#else
#define JT 2
#endif
#define V_TILE(KV)                                                                            \
  static inline __attribute__((always_inline)) void v_tile_##KV(                             \
      const Work *w, const Unit *u, const float *scores, const float *inv_sum, int g0, int GT, \
      int j0, int jt) {                                                                       \
    const float *p[4];                                                                        \
    for (int g = 0; g < GT; g++)                                                              \
      p[g] = scores + (g0 + g < u->group ? g0 + g : u->group - 1) * u->span - u->first;       \
    vf acc[4][JT];                                                                            \
    for (int g = 0; g < GT; g++)                                                              \
      for (int j = 0; j < JT; j++) acc[g][j] = (vf){0};                                       \
    FOR_EACH_BLOCK(w, (*u), {                                                                 \
      const KV##_t *v_block = BLOCK_ROWS(w, (*u), w->value_cache, KV) + j0 * VW;             \
      for (int i = i_begin; i < n; i++) {                                                     \
        const KV##_t *v = v_block + i * u->row_stride;                                        \
        vf x[JT];                                                                             \
        for (int j = 0; j < JT; j++) x[j] = j < jt ? load_vf_##KV(v + j * VW) : (vf){0};      \
        for (int g = 0; g < GT; g++) {                                                        \
          const float pt = p[g][t0 + i];                                                      \
          for (int j = 0; j < JT; j++) acc[g][j] += pt * x[j];                                \
        }                                                                                     \
      }                                                                                       \
    })                                                                                        \
    for (int g = 0; g < GT && g0 + g < u->group; g++)                                         \
      for (int j = 0; j < jt; j++) {                                                          \
        const vf o = acc[g][j] * inv_sum[g0 + g];                                             \
        store_out(w, u, (g0 + g) * w->head_dim + (j0 + j) * VW, (const float *)&o, VW);        \
      }                                                                                       \
  }

// Blocks lie anywhere in the pool, so the hardware prefetchers cannot run ahead of a block table:
// while the first query head scores block b, this asks for this kv head's K rows of block
// b + PF_DIST (into L1) and V rows of block b (into L2: the V pass reads them after the softmax).
// always_inline: GCC 12 takes a function of prefetches alone for one without side effects and
// drops its calls.
static inline __attribute__((always_inline)) void prefetch_block(const Work *w, const Unit *u,
                                                                 int b, int elem_size) {
  const int64_t row_bytes = (int64_t)w->head_dim * elem_size;
  const int64_t stride = u->row_stride * elem_size, offset = u->head_offset * elem_size;
  const int64_t block_bytes = (int64_t)w->block_size * stride;
  const char *k_cache = (const char *)w->key_cache, *v_cache = (const char *)w->value_cache;
  const char *v = v_cache + u->block_table[b] * block_bytes + offset;
  const char *k = b + PF_DIST < u->num_blocks
                      ? k_cache + u->block_table[b + PF_DIST] * block_bytes + offset
                      : NULL;
  for (int r = 0; r < w->block_size; r++)
    for (int64_t c = 0; c < row_bytes; c += 64) {
      if (k != NULL) __builtin_prefetch(k + r * stride + c, 0, 3);
      __builtin_prefetch(v + r * stride + c, 0, 2);
    }
}

// One unit with head_dim = HD (a multiple of VW): for each query head of the group, the scores of
// every key, VW keys at a time (a block's rows for this head are re-read from L1 per head); the
// softmax; then the weighted sum of V rows, GT heads and JT vectors at a time.
#define ATTEND_UNIT(KV, HD, QK)                                                               \
  static void attend_##KV##_##HD(const Work *w, int64_t seq, int kv_head, float *scores) {   \
    const int head_dim = (HD);                                                                \
    const Unit u = unit_of(w, seq, kv_head);                                                  \
    const int64_t row_stride = u.row_stride;                                                  \
    for (int g = 0; g < u.group; g++) {                                                       \
      float q[HD];                                                                            \
      load_query(w, &u, g, q);                                                                \
      QK##_QUERY(HD)                                                                          \
      FOR_EACH_BLOCK(w, u, {                                                                  \
        const KV##_t *k_block = BLOCK_ROWS(w, u, w->key_cache, KV);                           \
        if (g == 0) prefetch_block(w, &u, b, sizeof(KV##_t));                                  \
        for (int i = i_begin; i < n; i += VW) {                                               \
          const int count = n - i < VW ? n - i : VW;                                          \
          QK##_CALL(KV, HD, k_block + i * row_stride, count,                                  \
                    scores + g * u.span + t0 + i - u.first);                                  \
        }                                                                                     \
      })                                                                                      \
    }                                                                                         \
    float inv_sum[MAX_GROUP];                                                                 \
    const float *sinks = of_group(w, w->sinks, kv_head);                                      \
    const float *alibi = of_group(w, w->alibi_slopes, kv_head);                               \
    softmax_rows(w->softcap, sinks, alibi, scores, u.group, u.span, inv_sum);                 \
    const int gt = u.group <= 4 ? u.group : u.group % 4 == 0 ? 4 : u.group % 3 == 0 ? 3 : 4;  \
    for (int g0 = 0; g0 < u.group; g0 += gt)                                                  \
      for (int j0 = 0; j0 < head_dim / VW; j0 += JT) {                                        \
        const int jt = head_dim / VW - j0 < JT ? head_dim / VW - j0 : JT;                     \
        switch (gt) { /* constant GTs: the accumulators stay in registers */                  \
          case 1: v_tile_##KV(w, &u, scores, inv_sum, g0, 1, j0, jt); break;                  \
          case 2: v_tile_##KV(w, &u, scores, inv_sum, g0, 2, j0, jt); break;                  \
          case 3: v_tile_##KV(w, &u, scores, inv_sum, g0, 3, j0, jt); break;                  \
          default: v_tile_##KV(w, &u, scores, inv_sum, g0, 4, j0, jt); break;                 \
        }                                                                                     \
      }                                                                                       \
  }

// The query as the QK step takes it: float32 vectors, or bfloat16 pairs for dpbf16.
#define WIDEN_QUERY(HD) \
  vf qv[(HD) / VW];     \
  for (int j = 0; j < (HD) / VW; j++) memcpy(&qv[j], q + j * VW, sizeof(vf));
#define DPBF16_QUERY(HD)                                                                       \
  __m512bh qv[(HD) / 32];                                                                      \
  for (int j = 0; j < (HD) / 32; j++)                                                          \
    qv[j] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(q + 32 * j + 16), _mm512_loadu_ps(q + 32 * j));
#define WIDEN_CALL(KV, HD, k, count, s) qk_keys_##KV##_##HD(qv, k, row_stride, count, w->scale, s)
#define DPBF16_CALL(KV, HD, k, count, s) qk_keys_dpbf16_##HD(qv, k, row_stride, count, w->scale, s)

// Any head_dim, one float at a time.
#define ATTEND_ANY(KV)                                                                        \
  static void attend_##KV##_any(const Work *w, int64_t seq, int kv_head, float *scores) {    \
    const int head_dim = w->head_dim;                                                         \
    const Unit u = unit_of(w, seq, kv_head);                                                  \
    for (int g = 0; g < u.group; g++) {                                                       \
      float q[head_dim];                                                                      \
      load_query(w, &u, g, q);                                                                \
      FOR_EACH_BLOCK(w, u, {                                                                  \
        const KV##_t *k_block = BLOCK_ROWS(w, u, w->key_cache, KV);                           \
        for (int i = i_begin; i < n; i++) {                                                   \
          float dot = 0.0f;                                                                   \
          for (int d = 0; d < head_dim; d++)                                                  \
            dot += q[d] * load_f1_##KV(k_block + i * u.row_stride + d);                       \
          scores[g * u.span + t0 + i - u.first] = dot * w->scale;                             \
        }                                                                                     \
      })                                                                                      \
    }                                                                                         \
    float inv_sum[MAX_GROUP];                                                                 \
    const float *sinks = of_group(w, w->sinks, kv_head);                                      \
    const float *alibi = of_group(w, w->alibi_slopes, kv_head);                               \
    softmax_rows(w->softcap, sinks, alibi, scores, u.group, u.span, inv_sum);                 \
    for (int g = 0; g < u.group; g++) {                                                       \
      float o[head_dim];                                                                      \
      for (int d = 0; d < head_dim; d++) o[d] = 0.0f;                                         \
      FOR_EACH_BLOCK(w, u, {                                                                  \
        const KV##_t *v_block = BLOCK_ROWS(w, u, w->value_cache, KV);                         \
        for (int i = i_begin; i < n; i++) {                                                   \
          const float p = scores[g * u.span + t0 + i - u.first];                              \
          for (int d = 0; d < head_dim; d++)                                                  \
            o[d] += p * load_f1_##KV(v_block + i * u.row_stride + d);                         \
        }                                                                                     \
      })                                                                                      \
      for (int d = 0; d < head_dim; d++) o[d] *= inv_sum[g];                                  \
      store_out(w, &u, (int64_t)g * head_dim, o, head_dim);                                   \
    }                                                                                         \
  }

#define QK_KEYS_ALL(KV) \
  QK_KEYS(KV, 64) QK_KEYS(KV, 80) QK_KEYS(KV, 96) QK_KEYS(KV, 128) QK_KEYS(KV, 256) \
  QK_KEYS(KV, 576)
#define ATTEND_UNITS(KV, QK)                                                                  \
  V_TILE(KV)                                                                                  \
  ATTEND_UNIT(KV, 64, QK) ATTEND_UNIT(KV, 80, WIDEN) ATTEND_UNIT(KV, 96, QK)                  \
  ATTEND_UNIT(KV, 128, QK) ATTEND_UNIT(KV, 256, QK) ATTEND_UNIT(KV, 576, QK) ATTEND_ANY(KV)

QK_KEYS_ALL(f32)
QK_KEYS_ALL(bf16)
QK_KEYS_ALL(f16)
ATTEND_UNITS(f32, WIDEN)
#if HAVE_DPBF16  // 80 = 5 x 16 is no whole number of 32-element pairs: it widens
QK_KEYS_DPBF16(64) QK_KEYS_DPBF16(96) QK_KEYS_DPBF16(128) QK_KEYS_DPBF16(256)
QK_KEYS_DPBF16(576)  // MLA's latent: kv_lora_rank 512 + qk_rope_head_dim 64
ATTEND_UNITS(bf16, DPBF16)
#else
ATTEND_UNITS(bf16, WIDEN)
#endif
ATTEND_UNITS(f16, WIDEN)
QK_KEYS_ALL(e4m3)
QK_KEYS_ALL(e5m2)
ATTEND_UNITS(e4m3, WIDEN)
ATTEND_UNITS(e5m2, WIDEN)

#include "paged_attention_heads_cpu.h"
#define ATTEND_HEADS_ALL(KV, QK)                                                        \
  ATTEND_HEADS(KV, 64, QK) ATTEND_HEADS(KV, 80, WIDEN) ATTEND_HEADS(KV, 96, QK)          \
  ATTEND_HEADS(KV, 128, QK) ATTEND_HEADS(KV, 256, QK)
ATTEND_HEADS_ALL(f32, WIDEN)
#if HAVE_DPBF16
ATTEND_HEADS_ALL(bf16, DPBF16)
#else
ATTEND_HEADS_ALL(bf16, WIDEN)
#endif
ATTEND_HEADS_ALL(f16, WIDEN)
ATTEND_HEADS_ALL(e4m3, WIDEN)
ATTEND_HEADS_ALL(e5m2, WIDEN)

// With -DPAGEDGEN_KV_DTYPE=c (pagedgen.kernels.cpu builds one library per cache dtype), only
// that dtype's functions are referenced, and the compiler drops the others' (the five dtypes
// together took ~50 s to build at -O3); the entry point refuses the rest.
#ifdef PAGEDGEN_KV_DTYPE
#define BUILT(code) (PAGEDGEN_KV_DTYPE == (code))
#else
#define BUILT(code) 1
#endif
// PICK(KV)'s function for kv_dtype (KV_DTYPE_CODES' order), NULL where this build has none.
#define PICK_BY_DTYPE(PICK)                 \
  if (BUILT(0) && kv_dtype == 0) PICK(f32)  \
  if (BUILT(1) && kv_dtype == 1) PICK(bf16) \
  if (BUILT(2) && kv_dtype == 2) PICK(f16)  \
  if (BUILT(3) && kv_dtype == 3) PICK(e4m3) \
  if (BUILT(4) && kv_dtype == 4) PICK(e5m2) \
  return NULL;

typedef void (*AttendUnit)(const Work *, int64_t, int, float *);
typedef void (*AttendHeads)(const Work *, int64_t, int, int, const HeadsScratch *);

#define PICK_HEADS(KV)                         \
  switch (head_dim) {                          \
    case 64: return attend_heads_##KV##_64;    \
    case 80: return attend_heads_##KV##_80;    \
    case 96: return attend_heads_##KV##_96;    \
    case 128: return attend_heads_##KV##_128;  \
    case 256: return attend_heads_##KV##_256;  \
    default: return NULL;                      \
  }

// The sequence-major pass where it applies: several kv heads (a stride apart in each row) of
// small groups (MLA's one latent, read whole by the unit pass, stays there); NULL elsewhere.
static AttendHeads attend_heads_for(int kv_dtype, int head_dim, int num_kv_heads, int group) {
  if (num_kv_heads < 2 || group > 8) return NULL;
  PICK_BY_DTYPE(PICK_HEADS)
}

#define PICK_UNIT(KV)                      \
  switch (head_dim) {                      \
    case 64: return attend_##KV##_64;      \
    case 80: return attend_##KV##_80;      \
    case 96: return attend_##KV##_96;      \
    case 128: return attend_##KV##_128;    \
    case 256: return attend_##KV##_256;    \
    case 576: return attend_##KV##_576;    \
    default: return attend_##KV##_any;     \
  }

static AttendUnit attend_unit_for(int kv_dtype, int head_dim) {
  PICK_BY_DTYPE(PICK_UNIT)
}

// Runs of a sequence's kv heads, MAX_ROWS query heads at most, through the sequence-major pass.
static int run_heads(const Work *w, AttendHeads attend, int max_context_len) {
  const int group = w->num_heads / w->num_kv_heads;
  const int max_heads = MAX_ROWS / group;
  HeadsScratch x;
  x.scores = (float *)malloc(sizeof(float) * MAX_ROWS * (size_t)(max_context_len + 1));
  x.acc = (float *)aligned_alloc(64, sizeof(float) * MAX_ROWS * (size_t)w->head_dim);
  x.qv = aligned_alloc(64, sizeof(float) * MAX_ROWS * (size_t)w->head_dim);
  int status = x.scores == NULL || x.acc == NULL || x.qv == NULL;
  for (int64_t u = w->unit_begin; u < w->unit_end && !status;) {
    const int64_t seq = u / w->num_kv_heads;
    const int h0 = (int)(u % w->num_kv_heads);
    int h1 = w->num_kv_heads;
    if (h1 - h0 > max_heads) h1 = h0 + max_heads;
    if (h1 - h0 > w->unit_end - u) h1 = h0 + (int)(w->unit_end - u);
    attend(w, seq, h0, h1, &x);
    u += h1 - h0;
  }
  free(x.scores), free(x.acc), free(x.qv);
  return status;
}

static int run_units(const Work *w, AttendUnit attend, AttendHeads heads) {
  int max_context_len = 0;
  for (int64_t u = w->unit_begin; u < w->unit_end; u++) {
    const int n = w->context_lens[u / w->num_kv_heads];
    max_context_len = n > max_context_len ? n : max_context_len;
  }
  if (heads != NULL) return run_heads(w, heads, max_context_len);
  const int group = w->num_heads / w->num_kv_heads;
  float *scores = (float *)malloc(sizeof(float) * (size_t)group * (size_t)(max_context_len + 1));
  if (scores == NULL) return 1;
  for (int64_t u = w->unit_begin; u < w->unit_end; u++) {
    const int64_t seq = u / w->num_kv_heads;
    const int kv_head = (int)(u % w->num_kv_heads);
    attend(w, seq, kv_head, scores);
  }
  free(scores);
  return 0;
}

// 1 where this build can load float16 caches, else 0.
int paged_attention_has_float16(void) {
#ifdef HAVE_FLOAT16
  return 1;
#else
  return 0;
#endif
}

// Returns 0 on success, 1 on a bad argument or a failed allocation.
int paged_attention_decode(int kv_dtype, int act_bf16, void *out, const void *query,
                           int64_t query_seq_stride,
                           const void *key_cache, const void *value_cache,
                           const int32_t *block_tables, int64_t block_table_stride,
                           const int32_t *context_lens, int64_t num_seqs, int num_heads,
                           int num_kv_heads, int head_dim, int block_size, float scale,
                           int sliding_window, float softcap, const float *sinks,
                           const float *alibi_slopes, int num_threads) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || num_heads / num_kv_heads > MAX_GROUP)
    return 1;
  if (kv_dtype < 0 || kv_dtype > 4 || (kv_dtype == 2 && !paged_attention_has_float16())) return 1;
  const AttendUnit attend = attend_unit_for(kv_dtype, head_dim);
  if (attend == NULL) return 1;  // a cache dtype this build leaves out
  const AttendHeads heads =
      attend_heads_for(kv_dtype, head_dim, num_kv_heads, num_heads / num_kv_heads);
  if (num_threads < 1) num_threads = 1;
  if (num_threads > MAX_THREADS) num_threads = MAX_THREADS;
  const int64_t num_units = num_seqs * num_kv_heads;
  if (num_threads > num_units) num_threads = num_units > 0 ? (int)num_units : 1;

  // Contiguous runs of units with about equal total context, the cost of a unit.
  int64_t total = 0;
  for (int64_t s = 0; s < num_seqs; s++) total += (int64_t)context_lens[s] * num_kv_heads;
  Work work[MAX_THREADS];
  int64_t unit = 0, done = 0;
  for (int i = 0; i < num_threads; i++) {
    const int64_t target = total * (i + 1) / num_threads;
    work[i] = (Work){out,        query,        key_cache,  value_cache, block_tables,
                     context_lens, query_seq_stride, block_table_stride, num_heads,
                     num_kv_heads, head_dim,     block_size, scale,       sliding_window,
                     softcap,      sinks,        alibi_slopes, unit,      unit,
                     act_bf16};
    while (unit < num_units && (done < target || i == num_threads - 1)) {
      done += context_lens[unit / num_kv_heads];
      unit++;
    }
    work[i].unit_end = unit;
  }

  int status = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(num_threads) reduction(| : status)
  for (int i = omp_get_thread_num(); i < num_threads; i += omp_get_num_threads())
    status |= run_units(&work[i], attend, heads);
#else
  for (int i = 0; i < num_threads; i++) status |= run_units(&work[i], attend, heads);
#endif
  return status;
}
