#pragma once
// The decode kernel's unit pass (paged_attention_cpu.c inlines this file after its Work): one
// (sequence, kv head) unit at a time, all the query heads of its group: the scores of every key,
// the softmax, then the weighted sum of V rows. ATTEND_UNIT instantiates it for a cache dtype and
// head_dim; paged_attention_heads_cpu.h builds its sequence-major pass from these pieces.

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

// The softmax of the unit's score rows (softcap, sinks and ALiBi as w asks); inv_sum[g] is 1 over
// row g's sum, which the V pass applies.
static inline void softmax_unit(const Work *w, const Unit *u, int kv_head, float *scores,
                                float *inv_sum) {
  const float *sinks = of_group(w, w->sinks, kv_head);
  const float *alibi = of_group(w, w->alibi_slopes, kv_head);
  softmax_rows(w->softcap, sinks, alibi, scores, u->group, u->span, inv_sum);
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

// One vector of output values from element i of the unit's output, as store_out.
static inline void store_out_vf(const Work *w, const Unit *u, int64_t i, vf v) {
  if (w->act_bf16) {
    const vu16 h = vf_to_bf16(v);
    memcpy((bf16_t *)w->out + u->out_offset + i, &h, sizeof h);
  } else {
    store_vf((float *)w->out + u->out_offset + i, v);
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
_Static_assert(JT % 2 == 0, "the sequence-major V pass loads vectors in pairs (see load_vf2)");
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
        store_out_vf(w, u, (g0 + g) * w->head_dim + (j0 + j) * VW,                           \
                     acc[g][j] * inv_sum[g0 + g]);                                            \
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
    softmax_unit(w, &u, kv_head, scores, inv_sum);                                            \
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
    softmax_unit(w, &u, kv_head, scores, inv_sum);                                            \
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
