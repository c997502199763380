// Paged prefill attention on AMX tiles (Intel Xeon since Sapphire Rapids) for bfloat16 queries
// and a bfloat16 cache, head_dim a multiple of 16 up to 256: flash attention's loop with both
// matmuls, S = Q K^T and O += P V, as bfloat16 tile dot products into float32 and the online
// softmax in AVX-512 between them. Where prefill_attention_cpu.c spends two FMAs a score and a
// dimension, a tile dot product does 16 x 16 x 32 multiply-adds at once; what is left is the
// softmax, so exp2 is a polynomial here, not libm's (attention_amx.h).
//
//   pack     each (sequence, kv head)'s context K and V once, in the layouts the tiles take,
//            head_dim padded with zeros to dp, a multiple of 32 (pack_kv_amx.h); every query
//            head of the GQA group and every query block reads them;
//   blocks   QB query rows of one head against chunks of up to KC keys that start at multiples
//            of KC: S to memory in float32; per row the running max and sum in base 2, P rounded
//            to bfloat16, O rescaled in memory (float32) and accumulated on tiles.
//
// Arguments and cache layout as paged_attention_prefill's (prefill_attention_cpu.c), with
// windows, soft caps, sinks and ALiBi; other dtypes and head sizes return 2 (that kernel takes
// them). Keys before a sequence's first visible position are never read (their blocks may be
// freed).
//
// A row's result depends neither on the rows beside it nor on where its block ends: chunks
// start at multiples of KC whatever the block, and keys a row must not see add exact zeros.
// So a prompt continued after cached blocks gives the bits the whole prompt gives.

#include <math.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attention_amx.h"
#include "pack_kv_amx.h"

#define QB 32    // query rows a block: two tiles of 16
#define KC 128   // keys a chunk: one softmax update (S and P of a block stay in L1)
#define MAX_D 256
#define LOG2E 1.4426950408889634f

typedef struct {
  bf16 *out;
  const bf16 *query, *key_cache, *value_cache;
  const int32_t *block_tables, *query_starts, *query_lens, *context_lens;
  int64_t query_row_stride, block_table_stride;
  int num_heads, num_kv_heads, head_dim, block_size, sliding_window;
  int dp;  // head_dim padded to 32: the tiles' dot products and O's columns
  float scale, softcap;
  const float *sinks, *alibi_slopes;
} Args;

typedef struct {  // what a block needs of its sequence and kv head
  int64_t seq;
  int kv_head, packed_from;  // Kp/Vp start at key packed_from, a multiple of KC
  const bf16 *kp, *vp;
} Packed;

typedef struct {  // a thread's buffers, 64-byte aligned
  bf16 q[QB * MAX_D], p[QB * KC];
  float s[QB * KC], o[QB * MAX_D], m[QB], l[QB];
} Scratch;

static inline int round_up(int x, int n) { return (x + n - 1) / n * n; }

// The first key position query position p sees.
static inline int visible_from(const Args *a, int p) {
  const int w = a->sliding_window;
  return w > 0 && p - w + 1 > 0 ? p - w + 1 : 0;
}

static inline int first_query(const Args *a, int64_t s) {
  return a->context_lens[s] - a->query_lens[s];
}

// A row's scores over a chunk's keys [kb, kb + nk), in place: -inf outside [from, pos]; with a
// soft cap or ALiBi (transformed) into base 2, capped and biased. Returns their max in base 2.
static float row_max(const Args *a, float *s, int nk, int kb, int pos, int from, float scale2,
                     float slope2) {
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const int transformed = slope2 != 0.0f || a->softcap != 0.0f;
  __m512 top = _mm512_set1_ps(-INFINITY);
  if (!transformed && kb >= from && kb + nk - 1 <= pos) {  // every key seen, S as it is
    for (int j = 0; j < nk; j += 16) top = _mm512_max_ps(top, _mm512_loadu_ps(s + j));
    return _mm512_reduce_max_ps(top) * scale2;
  }
  for (int j = 0; j < nk; j += 16) {
    const __m512i key = _mm512_add_epi32(_mm512_set1_epi32(kb + j), iota);
    __m512 x = _mm512_loadu_ps(s + j);
    if (a->softcap != 0.0f) {  // softcap * tanh(scores / softcap), in base 2
      const __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(a->scale / a->softcap));
      x = _mm512_mul_ps(tanh_ps(y), _mm512_set1_ps(a->softcap * LOG2E));
    } else if (transformed) {
      x = _mm512_mul_ps(x, _mm512_set1_ps(scale2));
    }
    if (slope2 != 0.0f) {
      const __m512 distance = _mm512_cvtepi32_ps(_mm512_sub_epi32(key, _mm512_set1_epi32(pos)));
      x = _mm512_fmadd_ps(distance, _mm512_set1_ps(slope2), x);
    }
    const __mmask16 seen = _mm512_cmp_epi32_mask(key, _mm512_set1_epi32(from), _MM_CMPINT_NLT) &
                           _mm512_cmp_epi32_mask(key, _mm512_set1_epi32(pos), _MM_CMPINT_LE);
    x = _mm512_mask_blend_ps(seen, _mm512_set1_ps(-INFINITY), x);
    _mm512_storeu_ps(s + j, x);
    top = _mm512_max_ps(top, x);
  }
  const float m = _mm512_reduce_max_ps(top);
  return transformed ? m : m * scale2;
}

// P = 2^(s * scale2 - m) rounded to bfloat16 (scale2 1 for scores row_max scaled); their sum.
static float row_exp(const float *s, bf16 *p, int nk, float scale2, float m) {
  const __m512 shift = _mm512_set1_ps(-m), scale = _mm512_set1_ps(scale2);
  __m512 sum = _mm512_setzero_ps();
  for (int j = 0; j < nk; j += 16) {
    const __m512 e = exp2_nonpositive(_mm512_fmadd_ps(_mm512_loadu_ps(s + j), scale, shift));
    sum = _mm512_add_ps(sum, e);
    _mm256_storeu_si256((__m256i *)(p + j), (__m256i)_mm512_cvtneps_pbh(e));
  }
  return _mm512_reduce_add_ps(sum);
}

// The block's softmax step over a chunk: maxima, then per 16 rows the new running max and
// alpha = 2^(old - new) (1 where it holds), P and its sums, and O's rows rescaled by alpha.
static void softmax(Scratch *w, int nq, int nk, int kb, int p0, const Args *a, float scale2,
                    float slope2) {
  float top[QB], alpha[QB], sum[QB];
  for (int i = 0; i < QB; i++) {
    const int pos = p0 + i;
    top[i] = i < nq ? row_max(a, w->s + i * KC, nk, kb, pos, visible_from(a, pos), scale2, slope2)
                    : -INFINITY;
  }
  for (int i = 0; i < QB; i += 16) {
    const __m512 m = _mm512_loadu_ps(w->m + i);
    const __m512 m_new = _mm512_max_ps(m, _mm512_loadu_ps(top + i));
    _mm512_storeu_ps(alpha + i, exp2_nonpositive(_mm512_sub_ps(m, m_new)));
    _mm512_storeu_ps(w->m + i, m_new);
  }
  const float multiplier = slope2 == 0.0f && a->softcap == 0.0f ? scale2 : 1.0f;  // row_max's
  for (int i = 0; i < nq; i++) sum[i] = row_exp(w->s + i * KC, w->p + i * KC, nk, multiplier, w->m[i]);
  for (int i = nq; i < QB; i++) sum[i] = 0.0f;
  for (int i = 0; i < QB; i += 16) {
    const __m512 l = _mm512_loadu_ps(w->l + i);
    _mm512_storeu_ps(w->l + i, _mm512_fmadd_ps(l, _mm512_loadu_ps(alpha + i), _mm512_loadu_ps(sum + i)));
  }
  const int d = a->dp;
  for (int i = 0; i < nq; i++) {
    if (alpha[i] == 1.0f) continue;
    float *o = w->o + i * d;
    for (int c = 0; c < d; c += 16)
      _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), _mm512_set1_ps(alpha[i])));
  }
}

// S for keys [kb, kb + nk) of the block's rows: Q (QB x d) times Kp's tiles.
static void scores(const Scratch *w, const bf16 *kp, float *s, int nk, int d) {
  for (int j = 0; j < nk; j += 32) {
    const bf16 *kt = kp + (int64_t)(j / 16) * 16 * d;  // the 16-key groups j and j + 16
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int c = 0; c < d / 32; c++) {
      _tile_loadd(4, w->q + c * 32, d * 2);
      _tile_loadd(5, w->q + 16 * d + c * 32, d * 2);
      _tile_loadd(6, kt + c * 512, 64);
      _tile_loadd(7, kt + 16 * d + c * 512, 64);
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, s + j, KC * 4); _tile_stored(1, s + j + 16, KC * 4);
    _tile_stored(2, s + 16 * KC + j, KC * 4); _tile_stored(3, s + 16 * KC + j + 16, KC * 4);
  }
}

// O (QB x d, float32) += P (QB x nk) times Vp's tiles.
static void accumulate(Scratch *w, const bf16 *vp, int nk, int d) {
  for (int c = 0; c < d; c += 32) {
    float *o = w->o + c;
    _tile_loadd(0, o, d * 4); _tile_loadd(1, o + 16, d * 4);
    _tile_loadd(2, o + 16 * d, d * 4); _tile_loadd(3, o + 16 * d + 16, d * 4);
    for (int j = 0; j < nk; j += 32) {
      const bf16 *vt = vp + (int64_t)j * d + c * 32;  // the dims c and c + 16 of keys j..j + 31
      _tile_loadd(4, w->p + j, KC * 2); _tile_loadd(5, w->p + 16 * KC + j, KC * 2);
      _tile_loadd(6, vt, 64); _tile_loadd(7, vt + 512, 64);
      _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, o, d * 4); _tile_stored(1, o + 16, d * 4);
    _tile_stored(2, o + 16 * d, d * 4); _tile_stored(3, o + 16 * d + 16, d * 4);
  }
}

// Query head hq's rows at positions [p0, p1) of k's sequence (p1 - p0 <= QB).
static void attend(const Args *a, const Packed *k, int hq, int p0, int p1, Scratch *w) {
  const int d = a->head_dim, dp = a->dp, nq = p1 - p0;
  const int64_t row0 = a->query_starts[k->seq] + p0 - first_query(a, k->seq);
  for (int i = 0; i < QB; i++) {
    bf16 *q = w->q + i * dp;
    memset(q, 0, sizeof(bf16) * dp);
    if (i < nq) memcpy(q, a->query + (row0 + i) * a->query_row_stride + hq * d, sizeof(bf16) * d);
    w->m[i] = a->sinks ? a->sinks[hq] * LOG2E : -1e30f;  // finite: exp2(m - m) is 1
    w->l[i] = a->sinks ? 1.0f : 0.0f;
  }
  memset(w->o, 0, sizeof(float) * QB * dp);
  const float scale2 = a->scale * LOG2E;
  const float slope2 = a->alibi_slopes ? a->alibi_slopes[hq] * LOG2E : 0.0f;
  for (int kb = visible_from(a, p0) / KC * KC; kb < p1; kb += KC) {
    const int nk = round_up(p1, 32) - kb < KC ? round_up(p1, 32) - kb : KC;
    const int64_t key = kb - k->packed_from;
    scores(w, k->kp + key * dp, w->s, nk, dp);
    softmax(w, nq, nk, kb, p0, a, scale2, slope2);
    accumulate(w, k->vp + key * dp, nk, dp);
  }
  for (int i = 0; i < nq; i++) {
    const __m512 inv = _mm512_set1_ps(1.0f / w->l[i]);
    bf16 *out = a->out + ((row0 + i) * a->num_heads + hq) * d;
    for (int c = 0; c < d; c += 16) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(w->o + i * dp + c), inv);
      _mm256_storeu_si256((__m256i *)(out + c), (__m256i)_mm512_cvtneps_pbh(x));
    }
  }
}

int paged_attention_prefill_amx(int kv_dtype, int act_bf16, void *out, const void *query,
                                int64_t query_row_stride, const void *key_cache,
                                const void *value_cache, const int32_t *block_tables,
                                int64_t block_table_stride, const int32_t *query_starts,
                                const int32_t *query_lens, const int32_t *context_lens,
                                int64_t num_seqs, int num_heads, int num_kv_heads, int head_dim,
                                int block_size, float scale, int sliding_window, float softcap,
                                const float *sinks, const float *alibi_slopes, int num_threads) {
  if (kv_dtype != 1 || !act_bf16 || head_dim % 16 || head_dim > MAX_D || num_kv_heads <= 0 ||
      num_heads % num_kv_heads)
    return 2;
  if (request_tiles()) return 3;
  const Args a = {out,          query,        key_cache,    value_cache,        block_tables,
                  query_starts, query_lens,   context_lens, query_row_stride,   block_table_stride,
                  num_heads,    num_kv_heads, head_dim,     block_size,         sliding_window,
                  round_up(head_dim, 32),     scale,        softcap,            sinks,
                  alibi_slopes};
  const int64_t num_packed = num_seqs * num_kv_heads;
  Packed *packed = (Packed *)malloc(sizeof(Packed) * (size_t)(num_packed > 0 ? num_packed : 1));
  if (packed == NULL) return 1;
  int64_t size = 0, num_blocks = 0;  // bfloat16 elements of Kp (and of Vp); query blocks
  for (int64_t s = 0; s < num_seqs; s++) {
    const int from = visible_from(&a, first_query(&a, s)) / KC * KC;
    for (int h = 0; h < num_kv_heads; h++) {
      packed[s * num_kv_heads + h] = (Packed){s, h, from, NULL, NULL};
      size += (int64_t)(round_up(context_lens[s], 32) - from) * a.dp;
    }
    num_blocks += (query_lens[s] + QB - 1) / QB;
  }
  const int64_t num_items = num_blocks * num_heads;
  bf16 *buffer = (bf16 *)aligned_alloc(64, sizeof(bf16) * (size_t)(2 * size + 32));
  int64_t *items = (int64_t *)malloc(sizeof(int64_t) * (size_t)(num_items > 0 ? num_items : 1));
  if (buffer == NULL || items == NULL) {
    free(packed), free(buffer), free(items);
    return 1;
  }
  int64_t offset = 0, n = 0;
  for (int64_t i = 0; i < num_packed; i++) {
    const int64_t s = packed[i].seq;
    packed[i].kp = buffer + offset;
    packed[i].vp = buffer + size + offset;
    offset += (int64_t)(round_up(context_lens[s], 32) - packed[i].packed_from) * a.dp;
  }
  // Items (sequence, query block, head), each block's heads together; the latest blocks of a
  // sequence, the costliest, first, so the threads' last items are short ones.
  for (int64_t s = 0; s < num_seqs; s++)
    for (int b = (query_lens[s] + QB - 1) / QB - 1; b >= 0; b--)
      for (int hq = 0; hq < num_heads; hq++) items[n++] = ((s * 65536 + b) << 16) | hq;
  int failed = 0;
#pragma omp parallel num_threads(num_threads)
  {
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_packed; i++) {
      const Packed *k = &packed[i];
      const int from = visible_from(&a, first_query(&a, k->seq));
      const PackedCache c = {key_cache,  value_cache,  block_tables + k->seq * block_table_stride,
                             block_size, (int64_t)num_kv_heads * head_dim, k->kv_head * head_dim,
                             head_dim,   a.dp};
      pack_kv(&c, k->packed_from, from, context_lens[k->seq], (bf16 *)k->kp, (bf16 *)k->vp);
    }
    Scratch *w = (Scratch *)aligned_alloc(64, sizeof(Scratch));
    if (w == NULL) {
#pragma omp atomic write
      failed = 1;
    } else {
      memset(w, 0, sizeof(Scratch));
      configure_tiles();
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < num_items; i++) {
      if (w == NULL) continue;
      const int64_t s = items[i] >> 32;
      const int b = (int)((items[i] >> 16) & 65535), hq = (int)(items[i] & 65535);
      const int p0 = first_query(&a, s) + b * QB;
      const int p1 = p0 + QB < context_lens[s] ? p0 + QB : context_lens[s];
      attend(&a, &packed[s * num_kv_heads + hq / (num_heads / num_kv_heads)], hq, p0, p1, w);
    }
    if (w != NULL) _tile_release();
    free(w);
  }
  free(packed), free(buffer), free(items);
  return failed;
}
