// Paged decode attention for the CPU: one query row per sequence, K/V read through the block
// table in place, one pass over each (sequence, kv head) for all the query heads that share it
// (GQA). Two passes over the context: scores (q . k) for every token, then softmax, then the
// weighted sum of V rows. q, the scores and the output are float32; the cache is float32,
// bfloat16 or float16, widened to float32 as it is loaded (bfloat16 exactly, by a shift; float16
// by the F16C conversion where the target has it).
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
// become softcap * tanh(scores / softcap) before the softmax (Gemma 2).
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
#if defined(__AVX2__) || defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "cpu_math.h"

#define MAX_THREADS 256
#define MAX_GROUP 64  // query heads per kv head

// Cache element types. kv_dtype codes, as passed by pagedgen.kernels.cpu: 0 f32, 1 bf16, 2 f16.
typedef float f32_t;
typedef uint16_t bf16_t;  // the upper half of a float32
#ifdef __FLT16_MAX__
#define HAVE_FLOAT16 1
typedef _Float16 f16_t;
#else
typedef uint16_t f16_t;  // never loaded: the entry point refuses float16 without _Float16
#endif

typedef struct {
  float *out;          // [num_seqs, num_heads, head_dim], contiguous
  const float *query;  // [num_seqs, num_heads, head_dim], rows query_seq_stride apart
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
  int64_t unit_begin, unit_end;  // units: seq * num_kv_heads + kv_head
} Work;

// One vector of the target's native width: 16 floats with AVX-512, 8 with AVX/AVX2, else 4.
// (A vector wider than the target's registers is lowered through the stack: on AVX2, 16-float
// vectors made this kernel ~5x slower.) Every specialised head_dim is a multiple of 16.
#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
typedef uint16_t vu16 __attribute__((vector_size(VW * 2)));
typedef uint32_t vu32 __attribute__((vector_size(VW * 4)));

static inline vf load_vf_f32(const f32_t *p) {
  vf v;
  memcpy(&v, p, sizeof v);
  return v;
}

// Half-precision loads: one widening instruction where the target has it (GCC lowers the generic
// conversions element by element, or in halves), the generic vector code elsewhere.
static inline vf load_vf_bf16(const bf16_t *p) {
#if VW == 16 && defined(__AVX512F__)
  const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return (vf)_mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
#elif VW == 8 && defined(__AVX2__)
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return (vf)_mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
#else
  vu16 h;
  memcpy(&h, p, sizeof h);
  const vu32 bits = __builtin_convertvector(h, vu32) << 16;
  vf v;
  memcpy(&v, &bits, sizeof v);
  return v;
#endif
}

#if VW == 16 && defined(__AVX512F__)
static inline vf load_vf_f16(const f16_t *p) {
  return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
#elif VW == 8 && defined(__F16C__)
static inline vf load_vf_f16(const f16_t *p) {
  return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
#elif VW == 4 && defined(__F16C__)
static inline vf load_vf_f16(const f16_t *p) {
  return (vf)_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p));
}
#elif defined(HAVE_FLOAT16)
typedef _Float16 vh __attribute__((vector_size(VW * 2)));
static inline vf load_vf_f16(const f16_t *p) {
  vh h;
  memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, vf);
}
#else
static inline vf load_vf_f16(const f16_t *p) { return (vf){0}; }
#endif

#ifdef HAVE_FLOAT16
static inline float load_f1_f16(const f16_t *p) { return (float)*p; }
#else
static inline float load_f1_f16(const f16_t *p) { return 0.0f; }
#endif

static inline float hsum_vf(vf v) {
  float s = 0.0f;
  for (int i = 0; i < VW; i++) s += v[i];
  return s;
}

// The four sums of a0..a3, scaled, into out[0..3]: horizontal adds of the four together.
static inline void hsum4_vf(vf a0, vf a1, vf a2, vf a3, float scale, float *out) {
#if VW == 16 && defined(__AVX512F__)
  const __m256 b0 = _mm512_castps512_ps256((__m512)a0) +
                    (__m256)_mm512_extractf64x4_pd((__m512d)a0, 1);
  const __m256 b1 = _mm512_castps512_ps256((__m512)a1) +
                    (__m256)_mm512_extractf64x4_pd((__m512d)a1, 1);
  const __m256 b2 = _mm512_castps512_ps256((__m512)a2) +
                    (__m256)_mm512_extractf64x4_pd((__m512d)a2, 1);
  const __m256 b3 = _mm512_castps512_ps256((__m512)a3) +
                    (__m256)_mm512_extractf64x4_pd((__m512d)a3, 1);
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
  const __m128 r = _mm256_castps256_ps128(h) + _mm256_extractf128_ps(h, 1);
  _mm_storeu_ps(out, r * _mm_set1_ps(scale));
#elif VW == 8 && defined(__AVX__)
  // [a0 01, a0 23, a1 01, a1 23 | a0 45, ...] -> [a0 0123, a1 0123, a2 0123, a3 0123 | 4567 ...]
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps((__m256)a0, (__m256)a1),
                                  _mm256_hadd_ps((__m256)a2, (__m256)a3));
  const __m128 r = _mm256_castps256_ps128(h) + _mm256_extractf128_ps(h, 1);
  _mm_storeu_ps(out, r * _mm_set1_ps(scale));
#else
  out[0] = hsum_vf(a0) * scale;
  out[1] = hsum_vf(a1) * scale;
  out[2] = hsum_vf(a2) * scale;
  out[3] = hsum_vf(a3) * scale;
#endif
}

typedef float f1;
static inline void hsum4_f1(float a0, float a1, float a2, float a3, float scale, float *out) {
  out[0] = a0 * scale;
  out[1] = a1 * scale;
  out[2] = a2 * scale;
  out[3] = a3 * scale;
}
static inline float load_f1_f32(const f32_t *p) { return *p; }
static inline float load_f1_bf16(const bf16_t *p) {
  const uint32_t bits = (uint32_t)*p << 16;
  float v;
  memcpy(&v, &bits, sizeof v);
  return v;
}
static inline float hsum_f1(float v) { return v; }

// One (sequence, kv head) unit with head_dim = NV * WIDTH, in vectors of WIDTH floats. With NV a
// constant, q and the output accumulators stay in registers while a block's K or V rows for this
// head (a few KiB) are re-read from L1 for each query head of the group.
#define ATTEND_UNIT(NAME, KV, VEC, WIDTH, NV)                                                      \
  static void NAME(const Work *w, int64_t seq, int kv_head, float *scores) {                   \
    const int nv = (NV), head_dim = nv * (WIDTH);                                             \
    const int group = w->num_heads / w->num_kv_heads;                                         \
    const int context_len = w->context_lens[seq];                                             \
    const int block_size = w->block_size;                                                     \
    const int num_blocks = (context_len + block_size - 1) / block_size;                       \
    const int first = w->sliding_window > 0 && context_len > w->sliding_window                \
                          ? context_len - w->sliding_window                                   \
                          : 0;                                                                \
    const int span = context_len - first; /* scores[g * span + t - first] */                  \
    const float scale = w->scale;                                                             \
    const int64_t row_stride = (int64_t)w->num_kv_heads * head_dim;                           \
    const int64_t head_offset = (int64_t)kv_head * head_dim;                                  \
    const int32_t *block_table = w->block_tables + seq * w->block_table_stride;               \
    const float *q = w->query + seq * w->query_seq_stride + (int64_t)kv_head * group * head_dim; \
    float *out = w->out + (seq * w->num_heads + (int64_t)kv_head * group) * head_dim;         \
    for (int b = first / block_size; b < num_blocks; b++) {                                   \
      const KV##_t *k_block = (const KV##_t *)w->key_cache +                                \
                              (int64_t)block_table[b] * block_size * row_stride + head_offset; \
      const int t0 = b * block_size;                                                          \
      const int n = context_len - t0 < block_size ? context_len - t0 : block_size;            \
      for (int g = 0; g < group; g++) {                                                       \
        VEC qv[NV];                                                                           \
        for (int j = 0; j < nv; j++) qv[j] = load_##VEC##_f32(q + g * head_dim + j * (WIDTH)); \
        float *s = scores + g * span + t0 - first;                                            \
        int i = first > t0 ? first - t0 : 0;                                                  \
        for (; i + 4 <= n; i += 4) { /* four keys at a time: one horizontal reduction */      \
          const KV##_t *k = k_block + i * row_stride;                                         \
          VEC a0 = qv[0] * load_##VEC##_##KV(k);                                              \
          VEC a1 = qv[0] * load_##VEC##_##KV(k + row_stride);                                 \
          VEC a2 = qv[0] * load_##VEC##_##KV(k + 2 * row_stride);                             \
          VEC a3 = qv[0] * load_##VEC##_##KV(k + 3 * row_stride);                             \
          for (int j = 1; j < nv; j++) {                                                      \
            const KV##_t *kj = k + j * (WIDTH);                                               \
            a0 += qv[j] * load_##VEC##_##KV(kj);                                              \
            a1 += qv[j] * load_##VEC##_##KV(kj + row_stride);                                 \
            a2 += qv[j] * load_##VEC##_##KV(kj + 2 * row_stride);                             \
            a3 += qv[j] * load_##VEC##_##KV(kj + 3 * row_stride);                             \
          }                                                                                   \
          hsum4_##VEC(a0, a1, a2, a3, scale, s + i);                                          \
        }                                                                                     \
        for (; i < n; i++) {                                                                  \
          const KV##_t *k = k_block + i * row_stride;                                         \
          VEC acc = qv[0] * load_##VEC##_##KV(k);                                             \
          for (int j = 1; j < nv; j++) acc += qv[j] * load_##VEC##_##KV(k + j * (WIDTH));     \
          s[i] = hsum_##VEC(acc) * scale;                                                     \
        }                                                                                     \
      }                                                                                       \
    }                                                                                         \
    float inv_sum[MAX_GROUP];                                                                 \
    for (int g = 0; g < group; g++) {                                                         \
      float *s = scores + g * span;                                                           \
      if (w->softcap > 0.0f) {                                                                \
        const float cap = w->softcap, inv_cap = 1.0f / w->softcap;                            \
        for (int t = 0; t < span; t++) s[t] = cap * tanhf(s[t] * inv_cap);                    \
      }                                                                                       \
      float max = -INFINITY;                                                                  \
      for (int t = 0; t < span; t++) max = s[t] > max ? s[t] : max;                          \
      float sum = 0.0f;                                                                       \
      for (int t = 0; t < span; t++) {                                                        \
        s[t] = exp_nonpositive(s[t] - max);                                                   \
        sum += s[t];                                                                          \
      }                                                                                       \
      inv_sum[g] = 1.0f / sum;                                                                \
    }                                                                                         \
    for (int g = 0; g < group; g++) {                                                         \
      VEC acc[NV];                                                                            \
      for (int j = 0; j < nv; j++) acc[j] = (VEC){0};                                         \
      const float *p = scores + g * span - first;                                             \
      for (int b = first / block_size; b < num_blocks; b++) {                                 \
        const KV##_t *v_block = (const KV##_t *)w->value_cache +                            \
                                (int64_t)block_table[b] * block_size * row_stride + head_offset; \
        const int t0 = b * block_size;                                                        \
        const int n = context_len - t0 < block_size ? context_len - t0 : block_size;          \
        for (int i = first > t0 ? first - t0 : 0; i < n; i++) {                               \
          const KV##_t *v = v_block + i * row_stride;                                         \
          for (int j = 0; j < nv; j++) acc[j] += p[t0 + i] * load_##VEC##_##KV(v + j * (WIDTH)); \
        }                                                                                     \
      }                                                                                       \
      for (int j = 0; j < nv; j++) {                                                          \
        const VEC o = acc[j] * inv_sum[g];                                                    \
        memcpy(out + g * head_dim + j * (WIDTH), &o, sizeof o);                               \
      }                                                                                       \
    }                                                                                         \
  }

#define ATTEND_UNITS(KV)                                       \
  ATTEND_UNIT(attend_##KV##_64, KV, vf, VW, 64 / VW)           \
  ATTEND_UNIT(attend_##KV##_80, KV, vf, VW, 80 / VW)           \
  ATTEND_UNIT(attend_##KV##_96, KV, vf, VW, 96 / VW)           \
  ATTEND_UNIT(attend_##KV##_128, KV, vf, VW, 128 / VW)         \
  ATTEND_UNIT(attend_##KV##_256, KV, vf, VW, 256 / VW)         \
  ATTEND_UNIT(attend_##KV##_any, KV, f1, 1, w->head_dim)  // q and accumulators as float arrays

ATTEND_UNITS(f32)
ATTEND_UNITS(bf16)
ATTEND_UNITS(f16)

typedef void (*AttendUnit)(const Work *, int64_t, int, float *);

#define PICK_UNIT(KV)                      \
  switch (head_dim) {                      \
    case 64: return attend_##KV##_64;      \
    case 80: return attend_##KV##_80;      \
    case 96: return attend_##KV##_96;      \
    case 128: return attend_##KV##_128;    \
    case 256: return attend_##KV##_256;    \
    default: return attend_##KV##_any;     \
  }

static AttendUnit attend_unit_for(int kv_dtype, int head_dim) {
  if (kv_dtype == 0) PICK_UNIT(f32)
  if (kv_dtype == 1) PICK_UNIT(bf16)
  PICK_UNIT(f16)
}

static int run_units(const Work *w, AttendUnit attend) {
  int max_context_len = 0;
  for (int64_t u = w->unit_begin; u < w->unit_end; u++) {
    const int n = w->context_lens[u / w->num_kv_heads];
    max_context_len = n > max_context_len ? n : max_context_len;
  }
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
int paged_attention_decode(int kv_dtype, float *out, const float *query, int64_t query_seq_stride,
                           const void *key_cache, const void *value_cache,
                           const int32_t *block_tables, int64_t block_table_stride,
                           const int32_t *context_lens, int64_t num_seqs, int num_heads,
                           int num_kv_heads, int head_dim, int block_size, float scale,
                           int sliding_window, float softcap, int num_threads) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0 || num_heads / num_kv_heads > MAX_GROUP)
    return 1;
  if (kv_dtype < 0 || kv_dtype > 2 || (kv_dtype == 2 && !paged_attention_has_float16())) return 1;
  const AttendUnit attend = attend_unit_for(kv_dtype, head_dim);
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
                     softcap,      unit,         unit};
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
    status |= run_units(&work[i], attend);
#else
  for (int i = 0; i < num_threads; i++) status |= run_units(&work[i], attend);
#endif
  return status;
}
