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

// The rows of one block a pass reads: num_rows rows of `lines` cache lines from `rows` (aligned
// down to its line), a cache row apart.
typedef struct {
  const char *rows;
  int num_rows, lines;
} BlockRows;

// Every block a thread reads in the order it reads them (each run's K blocks, then its V blocks),
// and the one it reads now. Blocks lie anywhere in the pool, so the hardware prefetchers cannot
// run ahead of a block table: the passes ask for the lines of the block `lead` on in this list,
// a few lines at a time between their loads, so memory streams without a break across blocks,
// from the K pass to the V pass, and from one sequence to the next (asking at a pass's own next
// blocks only, each pass and each sequence began on a cold block). A burst of a block's lines at
// once stalls: each prefetch waits for a fill buffer, which the loads of this block wait on too.
typedef struct {
  BlockRows *blocks;
  int64_t num_blocks, at, lead;
  int64_t row_bytes;        // bytes from one cache row to the next
  const BlockRows *next;    // block at + lead, or NULL past the end of the stream
  const char *next_row;     // its next row to ask for, and the next line of that row
  int num_rows, next_line;  // its rows left to ask for, counting next_row
} Stream;

typedef struct {
  float *scores;  // [MAX_ROWS][max context + 1]
  float *acc;     // [MAX_ROWS][head_dim], 64-byte aligned; see load_vf2 for each 2 VW
  void *qv;       // [MAX_ROWS][query vectors], 64-byte aligned
  Stream stream;
} HeadsScratch;

// The lines of the block `lead` on, or 0 past the end of the stream.
static inline int lines_ahead(const Stream *s) {
  return s->next == NULL ? 0 : s->next->num_rows * s->next->lines;
}

// Asks for the next `count` lines of the block `lead` on into L2 (prefetcht2: into L1, they took
// fill buffers the loads of this block wait on). always_inline: GCC 12 takes a function of
// prefetches alone for one without side effects and drops its calls.
static inline __attribute__((always_inline)) void prefetch_lines(Stream *s, int count) {
  if (count <= 0 || s->num_rows == 0) return;
  const char *row = s->next_row;
  int line = s->next_line, num_rows = s->num_rows;
  const int lines = s->next->lines;
  for (; count > 0; count--) {
    __builtin_prefetch(row + line * 64, 0, 1);
    if (++line == lines) {
      line = 0, row += s->row_bytes;
      if (--num_rows == 0) break;
    }
  }
  s->next_row = row, s->next_line = line, s->num_rows = num_rows;
}

// Moves on to the stream's next block.
static inline void stream_advance(Stream *s) {
  s->at++;
  s->next = s->at + s->lead < s->num_blocks ? &s->blocks[s->at + s->lead] : NULL;
  s->next_row = s->next == NULL ? NULL : s->next->rows;
  s->num_rows = s->next == NULL ? 0 : s->next->num_rows;
  s->next_line = 0;
}

// The query rows as the q . k steps take them: float32 vectors, or bfloat16 pairs for dpbf16.
#define WIDEN_QN(HD) ((HD) / VW)
#define WIDEN_QTYPE vf
#define WIDEN_QSET(dst, q, HD)                                                                \
  for (int j = 0; j < (HD) / VW; j++) memcpy(&(dst)[j], (q) + j * VW, sizeof(vf));
#define WIDEN_QK(KV, HD, qv, k, count, s)                                                     \
  qk_keys_##KV##_##HD(qv, k, row_stride, count, w->scale, s)
#define DPBF16_QN(HD) ((HD) / 32)
#define DPBF16_QTYPE __m512bh
#define DPBF16_QSET(dst, q, HD)                                                               \
  for (int j = 0; j < (HD) / 32; j++)                                                         \
    (dst)[j] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps((q) + 32 * j + 16),                        \
                                   _mm512_loadu_ps((q) + 32 * j));
#define DPBF16_QK(KV, HD, qv, k, count, s)                                                    \
  qk_keys_dpbf16_##HD(qv, k, row_stride, count, w->scale, s)

// acc[g][j0 ..] += p[g][i] * v row i, for GT rows of accumulators (acc_stride floats apart) and
// jt <= JT vectors, over `rows` rows of one kv head in a block: the accumulators stay in
// registers over the block, each row of V loaded once for the GT query heads.
#define V_ROWS(KV)                                                                            \
  static inline __attribute__((always_inline)) void v_rows_##KV(                              \
      const KV##_t *v, int64_t row_stride, int rows, const float *const *p, int GT, int jt,   \
      float *acc, int acc_stride, Stream *stream, int pf) {                                   \
    vf a[4][JT];                                                                              \
    for (int g = 0; g < GT; g++)                                                              \
      for (int j = 0; j < JT; j++)                                                            \
        a[g][j] = j < jt ? load_vf_f32(acc + g * acc_stride + j * VW) : (vf){0};              \
    for (int i = 0; i < rows; i++) {                                                          \
      prefetch_lines(stream, pf);                                                             \
      vf x[JT]; /* JT is even */                                                              \
      for (int j = 0; j < JT; j += 2) {                                                       \
        if (j + 1 < jt) {                                                                     \
          load_vf2_##KV(v + i * row_stride + j * VW, &x[j], &x[j + 1]);                       \
        } else {                                                                              \
          x[j] = j < jt ? load_vf_##KV(v + i * row_stride + j * VW) : (vf){0};                \
          x[j + 1] = (vf){0};                                                                 \
        }                                                                                     \
      }                                                                                       \
      for (int g = 0; g < GT; g++) {                                                          \
        const float pt = p[g][i];                                                             \
        for (int j = 0; j < JT; j++) a[g][j] += pt * x[j];                                    \
      }                                                                                       \
    }                                                                                         \
    for (int g = 0; g < GT; g++)                                                              \
      for (int j = 0; j < jt; j++) store_vf(acc + g * acc_stride + j * VW, a[g][j]);          \
  }

#define ATTEND_HEADS(KV, HD, QK)                                                              \
  static void attend_heads_##KV##_##HD(const Work *w, int64_t seq, int h0, int h1,            \
                                       HeadsScratch *x) {                                     \
    const Unit u = unit_of(w, seq, h0);                                                       \
    const int64_t row_stride = u.row_stride;                                                  \
    const int rows = (h1 - h0) * u.group, heads = h1 - h0;                                    \
    Stream *stream = &x->stream;                                                              \
    QK##_QTYPE *qv = (QK##_QTYPE *)x->qv;                                                     \
    for (int r = 0; r < rows; r++) {                                                          \
      float q[HD];                                                                            \
      load_query(w, &u, r, q); /* the range's query heads follow each other */                \
      QK##_QSET(qv + r * QK##_QN(HD), q, HD)                                                  \
    }                                                                                         \
    FOR_EACH_BLOCK(w, u, {                                                                    \
      const KV##_t *k_block = (const KV##_t *)w->key_cache +                                  \
                              (int64_t)u.block_table[b] * w->block_size * row_stride;         \
      const int parts = (n - i_begin + VW - 1) / VW * rows;                                   \
      const int pf = (lines_ahead(stream) + parts - 1) / parts;                               \
      for (int i = i_begin; i < n; i += VW) {                                                 \
        const int count = n - i < VW ? n - i : VW;                                            \
        for (int h = h0; h < h1; h++) {                                                       \
          for (int g = 0; g < u.group; g++) {                                                 \
            const int r = (h - h0) * u.group + g;                                             \
            prefetch_lines(stream, pf);                                                       \
            QK##_QK(KV, HD, qv + r * QK##_QN(HD), k_block + i * row_stride + h * (HD), count, \
                    x->scores + r * u.span + t0 + i - u.first);                               \
          }                                                                                   \
        }                                                                                     \
      }                                                                                       \
      stream_advance(stream);                                                                 \
    })                                                                                        \
    float inv_sum[MAX_ROWS];                                                                  \
    const float *sinks = of_group(w, w->sinks, h0), *alibi = of_group(w, w->alibi_slopes, h0); \
    const int pf = (lines_ahead(stream) + rows - 1) / rows;                                   \
    for (int r = 0; r < rows; r++) { /* a row at a time, the next V block asked for between */ \
      prefetch_lines(stream, pf);                                                             \
      softmax_rows(w->softcap, sinks == NULL ? NULL : sinks + r,                              \
                   alibi == NULL ? NULL : alibi + r, x->scores + r * u.span, 1, u.span,       \
                   inv_sum + r);                                                              \
    }                                                                                         \
    for (int j = 0; j < rows * (HD); j++) x->acc[j] = 0.0f;                                   \
    FOR_EACH_BLOCK(w, u, {                                                                    \
      const KV##_t *v_block = (const KV##_t *)w->value_cache +                                \
                              ((int64_t)u.block_table[b] * w->block_size + i_begin) * row_stride; \
      const int t = t0 + i_begin - u.first;                                                   \
      const int m = n - i_begin; /* rows of this block */                                     \
      const int parts = m * heads;                                                            \
      const int pf = (lines_ahead(stream) + parts - 1) / parts;                               \
      for (int h = h0; h < h1; h++) {                                                         \
        for (int g0 = 0; g0 < u.group; g0 += 4) {                                             \
          const int gt = u.group - g0 < 4 ? u.group - g0 : 4;                                 \
          const int r0 = (h - h0) * u.group + g0;                                             \
          const float *p[4];                                                                  \
          for (int g = 0; g < gt; g++) p[g] = x->scores + (r0 + g) * u.span + t;              \
          for (int j0 = 0; j0 < (HD) / VW; j0 += JT) {                                        \
            const int jt = (HD) / VW - j0 < JT ? (HD) / VW - j0 : JT;                         \
            const KV##_t *v = v_block + h * (HD) + j0 * VW;                                   \
            float *acc = x->acc + r0 * (HD) + j0 * VW;                                        \
            const int f = g0 == 0 && j0 == 0 ? pf : 0; /* the head's first tile asks */       \
            switch (gt) { /* constant GTs: the accumulators stay in registers */              \
              case 1: v_rows_##KV(v, row_stride, m, p, 1, jt, acc, HD, stream, f); break;     \
              case 2: v_rows_##KV(v, row_stride, m, p, 2, jt, acc, HD, stream, f); break;     \
              case 3: v_rows_##KV(v, row_stride, m, p, 3, jt, acc, HD, stream, f); break;     \
              default: v_rows_##KV(v, row_stride, m, p, 4, jt, acc, HD, stream, f); break;    \
            }                                                                                 \
          }                                                                                   \
        }                                                                                     \
      }                                                                                       \
      stream_advance(stream);                                                                 \
    })                                                                                        \
    for (int r = 0; r < rows; r++)                                                            \
      for (int j = 0; j < (HD) / VW; j += 2) {                                                \
        const float *acc = x->acc + r * (HD) + j * VW;                                        \
        vf lo = load_vf_f32(acc) * inv_sum[r], hi;                                            \
        if (j + 1 < (HD) / VW) {                                                              \
          hi = load_vf_f32(acc + VW) * inv_sum[r];                                            \
          if (PAIRED_##KV) interleave_vf(lo, hi, &lo, &hi);                                   \
          store_out_vf(w, &u, (int64_t)r * (HD) + (j + 1) * VW, hi);                          \
        }                                                                                     \
        store_out_vf(w, &u, (int64_t)r * (HD) + j * VW, lo);                                  \
      }                                                                                       \
  }
