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
// Blocks lie anywhere in the pool, so each pass asks for the next block's rows as it reads the
// same rows of this one, a line asked for each line read, into L2 (prefetcht2: into L1, they
// took fill buffers the loads of this block wait on). With a few vector ops a line, a loop over
// scattered blocks streams at ~13.5 GB/s here without it and ~20 with it (a C test); SmolLM2's
// heads, 32 x 2,048 tokens: 4.30 -> 3.48 ms a layer.
//
// Per (kv head, query head of its group) row r: scores as the unit pass computes them (the same
// q . k steps, in the same order), the same softmax_rows, then the weighted sum of V rows kept in
// acc[r] (float32, in L1) in position order, so a row's result does not depend on the heads
// beside it.

#define MAX_ROWS 128  // query heads a call attends at most: scores and accumulators per row

typedef struct {
  float *scores;  // [MAX_ROWS][max context + 1]
  float *acc;     // [MAX_ROWS][head_dim], 64-byte aligned
  void *qv;       // [MAX_ROWS][query vectors], 64-byte aligned
} HeadsScratch;

// Kv head h0's first element of block b + 1's rows in cache (K or V), or NULL after the last
// block.
static inline const char *next_block_rows(const Work *w, const Unit *u, const void *cache, int b,
                                          int h0, int elem_size) {
  if (b + 1 >= u->num_blocks) return NULL;
  const int64_t row = (int64_t)u->block_table[b + 1] * w->block_size * u->row_stride;
  return (const char *)cache + (row + (int64_t)h0 * w->head_dim) * elem_size;
}

// Rows r0 .. r1 of a block (bytes of each from rows, NULL: none) into L2. always_inline: see
// prefetch_block.
static inline __attribute__((always_inline)) void prefetch_rows_l2(const char *rows,
                                                                    const Unit *u, int r0, int r1,
                                                                    int bytes, int elem_size) {
  if (rows == NULL) return;
  for (int r = r0; r < r1; r++)
    for (int c = 0; c < bytes; c += 64)
      __builtin_prefetch(rows + r * u->row_stride * elem_size + c, 0, 1);
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

#define ATTEND_HEADS(KV, HD, QK)                                                              \
  static void attend_heads_##KV##_##HD(const Work *w, int64_t seq, int h0, int h1,           \
                                       const HeadsScratch *x) {                               \
    const Unit u = unit_of(w, seq, h0);                                                       \
    const int64_t row_stride = u.row_stride;                                                  \
    const int rows = (h1 - h0) * u.group;                                                     \
    QK##_QTYPE *qv = (QK##_QTYPE *)x->qv;                                                     \
    for (int r = 0; r < rows; r++) {                                                          \
      float q[HD];                                                                            \
      load_query(w, &u, r, q); /* the range's query heads follow each other */               \
      QK##_QSET(qv + r * QK##_QN(HD), q, HD)                                                  \
    }                                                                                         \
    FOR_EACH_BLOCK(w, u, {                                                                    \
      const KV##_t *k_block = (const KV##_t *)w->key_cache +                                  \
                              (int64_t)u.block_table[b] * w->block_size * row_stride;        \
      const char *k_next = next_block_rows(w, &u, w->key_cache, b, h0, sizeof(KV##_t));       \
      for (int i = i_begin; i < n; i += VW) {                                                 \
        const int count = n - i < VW ? n - i : VW;                                            \
        prefetch_rows_l2(k_next, &u, i, i + count, (h1 - h0) * (HD) * sizeof(KV##_t),         \
                         sizeof(KV##_t));                                                     \
        for (int h = h0; h < h1; h++)                                                         \
          for (int g = 0; g < u.group; g++) {                                                 \
            const int r = (h - h0) * u.group + g;                                             \
            QK##_QK(KV, HD, qv + r * QK##_QN(HD), k_block + i * row_stride + h * (HD), count, \
                    x->scores + r * u.span + t0 + i - u.first);                               \
          }                                                                                   \
      }                                                                                       \
    })                                                                                        \
    float inv_sum[MAX_ROWS];                                                                  \
    softmax_rows(w->softcap, of_group(w, w->sinks, h0), of_group(w, w->alibi_slopes, h0),     \
                 x->scores, rows, u.span, inv_sum);                                           \
    vf *acc = (vf *)x->acc;                                                                   \
    for (int j = 0; j < rows * ((HD) / VW); j++) acc[j] = (vf){0};                            \
    FOR_EACH_BLOCK(w, u, {                                                                    \
      const KV##_t *v_block = (const KV##_t *)w->value_cache +                                \
                              (int64_t)u.block_table[b] * w->block_size * row_stride;        \
      const char *v_next = next_block_rows(w, &u, w->value_cache, b, h0, sizeof(KV##_t));     \
      for (int i = i_begin; i < n; i++) {                                                     \
        const int t = t0 + i - u.first;                                                       \
        prefetch_rows_l2(v_next, &u, i, i + 1, (h1 - h0) * (HD) * sizeof(KV##_t),             \
                         sizeof(KV##_t));                                                     \
        for (int h = h0; h < h1; h++) {                                                       \
          vf v[(HD) / VW];                                                                    \
          for (int j = 0; j < (HD) / VW; j++)                                                 \
            v[j] = load_vf_##KV(v_block + i * row_stride + h * (HD) + j * VW);                \
          for (int g = 0; g < u.group; g++) {                                                 \
            const int r = (h - h0) * u.group + g;                                             \
            const float p = x->scores[r * u.span + t];                                        \
            vf *a = acc + r * ((HD) / VW);                                                    \
            for (int j = 0; j < (HD) / VW; j++) a[j] += p * v[j];                             \
          }                                                                                   \
        }                                                                                     \
      }                                                                                       \
    })                                                                                        \
    for (int r = 0; r < rows; r++)                                                            \
      for (int j = 0; j < (HD) / VW; j++) {                                                   \
        const vf o = acc[r * ((HD) / VW) + j] * inv_sum[r];                                   \
        store_out(w, &u, (int64_t)r * (HD) + j * VW, (const float *)&o, VW);                  \
      }                                                                                       \
  }
